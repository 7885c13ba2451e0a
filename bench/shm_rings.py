"""Submission, broadcast and telemetry rings: throughput and cost (docs/shm.md).

Prints, for docs/performance.md ("Shared memory"; every run in bench/NOTES.md):
  - enqueue items/s through the submission ring with 1 and 4 producer processes
    (pipelined, a window of 128 in flight each) next to the command ring's single-client
    rate (``Client("shm://…").enqueue`` in a loop), both against one ``dq serve --shm``;
  - broadcast messages/s delivered to 1 and 2 reader processes (40-byte messages, like an
    "enqueued" event of one id);
  - the server's cost of one telemetry snapshot (p50/p99), and of its ring writes alone.

Usage: ``python bench/shm_rings.py [--seconds 2] [--fsync never|interval|always]``.
Figures depend on the machine and its load; run it on an idle machine for the doc.
"""

from __future__ import annotations

import argparse
import contextlib
import mmap
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.servers import free_port, stop  # noqa: E402
from dq.shm.broadcast_ring import BroadcastReader, BroadcastWriter, init_ring, ring_size  # noqa: E402
from dq.shm.subscriber import submitter  # noqa: E402
from dq.shm.telemetry import MSG_WORDS, TelemetryPublisher, encode  # noqa: E402
from dq.shm.telemetry_ring import TelemetryRing  # noqa: E402
from dq.shm.telemetry_ring import init_ring as init_telemetry  # noqa: E402
from dq.shm.telemetry_ring import ring_size as telemetry_size  # noqa: E402

CTX = mp.get_context("fork")


@contextlib.contextmanager
def dq_server(data_dir: Path, fsync: str) -> Iterator[None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    env["DQ_SHM"] = "1"
    cmd = [
        sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(data_dir),
        "--port", str(free_port()), "--fsync", fsync, "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    try:
        give_up = time.monotonic() + 60
        while not ((data_dir / "dq-rings.json").exists() and (data_dir / "dq.sock").exists()):
            if proc.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError("dq serve did not start")
            time.sleep(0.05)
        yield
    finally:
        stop(proc)


# ---- submission ring vs command ring ---------------------------------------------------


def _producer(
    data: str, seconds: float, n: int, go: object, out: Connection, window: int = 128
) -> None:
    sub = submitter(data)
    go.wait(30)  # type: ignore[attr-defined]
    done, stop = 0, time.monotonic() + seconds
    while time.monotonic() < stop:
        if window == 1:
            sub.enqueue(f"sub{n}", b"x" * 64)
            done += 1
            continue
        done += len(sub.enqueue_many(f"sub{n}", (b"x" * 64 for _ in range(512)), window=window))
    out.send(done)
    os._exit(0)


def submission_rate(data: Path, producers: int, seconds: float, window: int = 128) -> float:
    go = CTX.Event()
    pipes = [CTX.Pipe(duplex=False) for _ in range(producers)]
    procs = [
        CTX.Process(target=_producer, args=(str(data), seconds, n, go, pipes[n][1], window))
        for n in range(producers)
    ]
    for p in procs:
        p.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    go.set()
    total = 0
    for reader, _ in pipes:
        if not reader.poll(seconds + 120):
            raise RuntimeError("a producer did not finish")
        total += reader.recv()
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join(10)
    return total / elapsed


def _command_client(data: str, seconds: float, out: Connection) -> None:
    from dq.client import Client

    with Client(f"shm://{data}") as dq:
        done, lat, stop = 0, [], time.monotonic() + seconds
        while time.monotonic() < stop:
            t = time.perf_counter()
            dq.enqueue("cmd", b"x" * 64)
            lat.append(time.perf_counter() - t)
            done += 1
    out.send((done / seconds, statistics.median(lat) * 1e6))
    os._exit(0)


def command_rate(data: Path, seconds: float) -> tuple[float, float]:
    reader, writer = CTX.Pipe(duplex=False)
    p = CTX.Process(target=_command_client, args=(str(data), seconds, writer))
    p.start()
    if not reader.poll(seconds + 60):
        raise RuntimeError("the command-ring client did not finish")
    rate, p50 = reader.recv()
    p.join(10)
    return float(rate), float(p50)


# ---- broadcast -------------------------------------------------------------------------


def _bcast_reader(buf: mmap.mmap, count: int, ready: object, out: Connection) -> None:
    reader = BroadcastReader(buf)
    ready.release()  # type: ignore[attr-defined]
    got = 0
    while got < count:
        got += len(reader.poll(timeout_s=1.0))
    out.send(time.monotonic())
    os._exit(0)


def broadcast_rate(readers: int, count: int) -> float:
    count -= count % 256  # whole batches
    buf = mmap.mmap(-1, ring_size(1 << 20))
    init_ring(buf, 1 << 20)
    ready = CTX.Semaphore(0)
    pipes = [CTX.Pipe(duplex=False) for _ in range(readers)]
    procs = [
        CTX.Process(target=_bcast_reader, args=(buf, count, ready, pipes[i][1]))
        for i in range(readers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire(timeout=30)
    writer = BroadcastWriter(buf, evict_after_s=60)
    msg = b"e" * 40
    batch = [msg] * 256
    t0 = time.monotonic()
    for _ in range(count // 256):
        writer.publish(batch)
    ends = []
    for reader, _ in pipes:
        if not reader.poll(120):
            raise RuntimeError("a broadcast reader did not finish")
        ends.append(reader.recv())
    for p in procs:
        p.join(10)
    return count / (max(ends) - t0)


# ---- telemetry -------------------------------------------------------------------------


def telemetry_cost(queues: int, rounds: int) -> dict[str, float]:
    from dq.storage import Engine, EngineConfig
    from dq.storage.types import NewItem

    with tempfile.TemporaryDirectory() as d, Engine.open(d, EngineConfig(fsync="never")) as eng:
        for i in range(queues):
            eng.enqueue(f"q{i}", [NewItem(b"x")] * 10)
        size = telemetry_size(256, MSG_WORDS)
        buf = mmap.mmap(-1, size)
        init_telemetry(buf, 256, MSG_WORDS)
        pub = TelemetryPublisher(eng, buf)
        costs = []
        for _ in range(rounds):
            pub.snapshot()
            costs.append(pub.last_cost_ns / 1000)
        ring = TelemetryRing(buf)
        reads = []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            stats = [eng.stats(name) for name in eng.list_queues()]
            reads.append((time.perf_counter_ns() - t) / 1000)
        writes = []
        for _ in range(rounds):
            t = time.perf_counter_ns()
            for s in stats:
                ring.enqueue(encode(_figures(s)))
            writes.append((time.perf_counter_ns() - t) / 1000)
    costs.sort()
    writes.sort()
    reads.sort()
    return {
        "engine_stats_p50_us": reads[len(reads) // 2],
        "snapshot_p50_us": costs[len(costs) // 2],
        "snapshot_p99_us": costs[int(len(costs) * 0.99)],
        "ring_writes_p50_us": writes[len(writes) // 2],
    }


def _figures(s: object) -> object:
    from dq.shm.telemetry import QueueFigures

    return QueueFigures(
        1, 0, 1, 0, s.name, s.pending, s.due, s.leased, s.delayed, 0, 0, 0, -1, 0, 0, 0, 0
    )  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--fsync", default="never", choices=["never", "interval", "always"])
    parser.add_argument("--broadcast", type=int, default=500_000, help="messages per run")
    args = parser.parse_args()
    print(f"cpus={os.cpu_count()} fsync={args.fsync} seconds={args.seconds}")
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "data"
        with dq_server(data, args.fsync):
            rate, p50 = command_rate(data, args.seconds)
            print(
                f"command ring, 1 client, single-item enqueue: {rate:,.0f} items/s (p50 {p50:.0f} us)"
            )
            r = submission_rate(data, 1, args.seconds, window=1)
            print(
                f"submission ring, 1 producer, one item at a time: {r:,.0f} items/s ({r / rate:.2f}x)"
            )
            for n in (1, 4):
                r = submission_rate(data, n, args.seconds)
                print(
                    f"submission ring, {n} producer(s), window 128: {r:,.0f} items/s ({r / rate:.2f}x)"
                )
    for readers in (1, 2):
        r = broadcast_rate(readers, args.broadcast)
        print(f"broadcast, {readers} reader(s), 40-byte messages: {r:,.0f} messages/s delivered")
    for queues in (1, 10, 100):
        c = telemetry_cost(queues, 200)
        print(
            f"telemetry snapshot, {queues} queue(s): p50 {c['snapshot_p50_us']:.0f} us, "
            f"p99 {c['snapshot_p99_us']:.0f} us; of which engine.stats p50 "
            f"{c['engine_stats_p50_us']:.0f} us, ring writes p50 {c['ring_writes_p50_us']:.0f} us"
        )


if __name__ == "__main__":
    main()
