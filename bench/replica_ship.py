"""What the leader's replicator adds to a write: ``Replicator.ship`` and the commit hop.

Run from the repository root:

    .venv/bin/python -m bench.replica_ship [--records 200000] [--payload 300]

In one process, no network, measures:

- ``ship`` per call (us): no follower attached (nothing kept); one follower attached
  that does not pull (the frame is encoded and kept); one follower pulling as fast as
  it can on the event loop (long-polls woken by the ships, acknowledging every answer:
  the loop's work shares the GIL with the shipping thread); 4 threads shipping at once
  with that follower pulling (wall time per ship);
- the wake-up: from a ship on another thread to the waiting pull's answer (p50/p99);
- a durable single-item enqueue on a real engine (fsync=always, this machine's disk),
  p50/p99, without replication and with a replicator of ``min_insync=1`` and no
  follower (the publish then waits for the replicator's commit thread: its hop is the
  difference).

It prints a table; ``bench/NOTES.md`` ("Replication: the leader's ship path") has the
runs with the machine and its load, ``docs/performance.md`` ("Replication") the current
figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import threading
import time
from typing import Any

from dq.server.replication.leader import Replicator
from dq.storage import Engine, EngineConfig
from dq.storage.replication import KIND_RECORD
from dq.storage.types import NewItem


class _Members:
    async def add_member(self, node: str) -> bool:
        return True

    async def remove_member(self, node: str) -> bool:
        return True


class _NoCommit:
    def commit(self, lsn: int) -> None:
        return None


def _replicator(engine: Any, min_insync: int = 2) -> Replicator:
    return Replicator(
        engine,
        node="bench",
        epoch=1,
        coordinator=_Members(),
        step_down=lambda reason: None,
        min_insync=min_insync,
        window_bytes=1 << 30,
    )


def _ship_loop(rep: Replicator, n: int, payload: bytes) -> float:
    ship = rep.ship
    t0 = time.perf_counter_ns()
    for _ in range(n):
        ship("q", KIND_RECORD, payload)
    return (time.perf_counter_ns() - t0) / n


async def _ship_cases(records: int, payload: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
    rep = await _replicator(_NoCommit()).start()
    try:
        out["no follower"] = await asyncio.to_thread(_ship_loop, rep, records, payload)
        rep.attach("f1")
        out["one follower, not pulling"] = await asyncio.to_thread(
            _ship_loop, rep, records, payload
        )
        stop = threading.Event()

        async def puller() -> None:
            while not stop.is_set():
                after = rep.followers()["f1"].position
                pulled = await rep.pull("f1", 1, after, 1000)
                if pulled.last_lsn > after:
                    await rep.pull("f1", 1, pulled.last_lsn, 0)

        task = asyncio.create_task(puller())
        out["one follower pulling"] = await asyncio.to_thread(_ship_loop, rep, records, payload)
        per = records // 4

        def four() -> float:
            threads = [
                threading.Thread(target=_ship_loop, args=(rep, per, payload)) for _ in range(4)
            ]
            t0 = time.perf_counter_ns()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return (time.perf_counter_ns() - t0) / (per * 4)

        out["4 threads, one pulling"] = await asyncio.to_thread(four)
        stop.set()
        rep.ship("q", KIND_RECORD, payload)  # ends a pull still waiting
        await task
    finally:
        await rep.stop()
    return out


async def _wake_latency(n: int, payload: bytes) -> tuple[float, float]:
    """From a ship on another thread to the waiting pull's answer on the loop (ms)."""
    rep = await _replicator(_NoCommit()).start()
    lat: list[float] = []
    try:
        after = rep.attach("f1")
        for _ in range(n):
            shipped: list[float] = []

            def later(shipped: list[float] = shipped) -> None:
                time.sleep(0.002)
                shipped.append(time.perf_counter())
                rep.ship("q", KIND_RECORD, payload)

            t = threading.Thread(target=later)
            t.start()
            pulled = await rep.pull("f1", 1, after, 1000)
            done = time.perf_counter()
            t.join()
            lat.append(done - shipped[0])
            after = pulled.last_lsn
    finally:
        await rep.stop()
    q = statistics.quantiles(lat, n=100)
    return q[49] * 1e3, q[98] * 1e3


def _enqueue_latencies(engine: Engine, n: int) -> list[float]:
    lat = []
    for i in range(n):
        t0 = time.perf_counter()
        engine.enqueue("q", [NewItem(b"v%d" % i)])
        lat.append(time.perf_counter() - t0)
    return lat


async def _enqueue_cases(n: int) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(dir=os.getcwd()) as tmp:
        engine = Engine.open(os.path.join(tmp, "data"), EngineConfig(fsync="always"))
        try:
            engine.ensure_queue("q")
            for label in ("no replication", "replicator, min_insync=1"):
                rep = None
                if label.startswith("replicator"):
                    rep = await _replicator(engine, min_insync=1).start()
                    engine.set_replication(rep)
                lat = await asyncio.to_thread(_enqueue_latencies, engine, n)
                if rep is not None:
                    engine.set_replication(None)
                    await rep.stop()
                q = statistics.quantiles(lat, n=100)
                out[label] = (q[49] * 1e3, q[98] * 1e3)
        finally:
            engine.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--payload", type=int, default=300, help="bytes per shipped record")
    parser.add_argument("--enqueues", type=int, default=500)
    args = parser.parse_args()
    payload = os.urandom(args.payload)
    ships = asyncio.run(_ship_cases(args.records, payload))
    wake = asyncio.run(_wake_latency(500, payload))
    enqueues = asyncio.run(_enqueue_cases(args.enqueues))
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs")
    print(f"Replicator.ship, {args.records} records of {args.payload} B:")
    for label, ns in ships.items():
        print(f"  {label:<28} {ns / 1000:6.2f} us")
    print(f"  ship -> waiting pull answered  p50 {wake[0]:6.3f} ms   p99 {wake[1]:6.3f} ms")
    print(f"durable single enqueue (fsync=always), {args.enqueues} in a row:")
    for label, (p50, p99) in enqueues.items():
        print(f"  {label:<28} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms")


if __name__ == "__main__":
    main()
