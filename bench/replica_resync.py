"""How long a follower's full resync takes, by the size of the leader's data.

Run from the repository root:

    .venv/bin/python -m bench.replica_resync [--mb 10 100] [--runs 3] [--queues 4]

Every (re)join of a follower is a full copy (docs/replication.md, "Every rejoin is a full
resync"), and after a failover with ``DQ_MIN_INSYNC=2`` writes wait until the first
follower has finished it, so its time is part of the failover time. In one process, on
127.0.0.1: a leader (the real server, uvicorn with dq's protocol, in a thread; its
engine leads through a ``Replicator``) holding ``--mb`` MiB of 1 KiB random items over
``--queues`` queues, and a follower (``Follower`` over its own engine, fsync=always).
For each size, ``--runs`` times: the follower follows, and the time until its snapshot
is installed is measured (the leader's copy, the tar over HTTP, the unpack with an fsync
of every file, and ``replace_queues`` reopening the queues), with the part spent in
``replace_queues`` alone. Both sides share this process (and its GIL) and the disk.

It prints a table; ``bench/NOTES.md`` ("Replication: a follower's resync") has the runs
with the machine and its load, ``docs/performance.md`` ("Replication") the current figure.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from datetime import UTC, datetime
from typing import Any

import uvicorn

from bench.servers import free_port
from dq.server.app import create_app
from dq.server.replication.follower import Follower
from dq.server.replication.leader import Replicator
from dq.server.runner import uvicorn_config
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig, NewItem
from dq.storage.replication import Frame

EPOCH = 1
#: incompressible values (segment files are compressed): 1 KiB slices of random bytes
_RANDOM = os.urandom(1 << 20)


class _Members:
    async def add_member(self, node: str) -> bool:
        return True

    async def remove_member(self, node: str) -> bool:
        return True


class _Node:
    def __init__(self, url: str) -> None:
        self.url = url

    def describe(self) -> dict[str, Any]:
        leader = {"node": "leader", "url": self.url}
        return {"node": "leader", "role": "leader", "epoch": EPOCH, "leader": leader}


class _TimedEngine:
    """The follower's engine, timing ``replace_queues``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.replace_s: list[float] = []

    def set_role(self, writable: bool, leader: str | None) -> None:
        self.engine.set_role(writable, leader)

    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]:
        return self.engine.apply(frames, stopping)

    def replace_queues(self, src_dir: str) -> None:
        t0 = time.perf_counter()
        self.engine.replace_queues(src_dir)
        self.replace_s.append(time.perf_counter() - t0)


class _Server:
    """The leader's server on 127.0.0.1 in a thread, with its own event loop."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.app = create_app(settings, engine)
        self.url = f"http://127.0.0.1:{settings.port}"
        config = uvicorn_config(self.app, settings, log_level="warning")
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.server.serve())

    def start(self) -> None:
        self.thread.start()
        give_up = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > give_up:
                raise RuntimeError("the leader's server did not start")
            time.sleep(0.02)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(60)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def _du(path: str) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            total += os.path.getsize(os.path.join(root, name))
    return total


def _fill(engine: Engine, mb: int, queues: int) -> None:
    items = mb * 1024
    for i in range(0, items, 1000):
        batch = [
            NewItem(_RANDOM[(n * 1024) % len(_RANDOM) :][:1024])
            for n in range(i, min(i + 1000, items))
        ]
        engine.enqueue(f"q{(i // 1000) % queues}", batch)


def _measure(mb: int, runs: int, queues: int, base: str) -> dict[str, Any]:
    lead_dir = os.path.join(base, f"leader-{mb}")
    engine = Engine.open(lead_dir, EngineConfig(fsync="always"))
    _fill(engine, mb, queues)
    settings = Settings(data_dir=lead_dir, fsync="always", shm=False, port=free_port())
    server = _Server(settings, engine)
    server.start()
    rep = Replicator(
        engine, node="leader", epoch=EPOCH, coordinator=_Members(),
        step_down=lambda reason: None, min_insync=1,
    )  # fmt: skip
    server.run(rep.start())
    engine.set_replication(rep)
    server.app.state.node = _Node(server.url)
    server.app.state.replicator = rep
    totals: list[float] = []
    timed: _TimedEngine | None = None
    follower_engine: Engine | None = None
    try:
        follower_dir = os.path.join(base, f"follower-{mb}")
        follower_engine = Engine.open(follower_dir, EngineConfig(fsync="always"))
        timed = _TimedEngine(follower_engine)
        follower = Follower(timed, follower_dir, "f1", wait_ms=200)
        for _ in range(runs):
            done = len(timed.replace_s)
            t0 = time.perf_counter()
            follower.follow(server.url, EPOCH)
            while len(timed.replace_s) == done:
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError(f"no resync in 600 s: {follower.status()}")
                time.sleep(0.005)
            totals.append(time.perf_counter() - t0)
            follower.stop()
        copied = _du(os.path.join(follower_dir, "queues"))
    finally:
        server.app.state.replicator = None
        engine.set_replication(None)
        server.run(rep.stop())
        server.stop()
        engine.close()
        if follower_engine is not None:
            follower_engine.close()
    assert timed is not None
    return {"mb": mb, "bytes": copied, "total": totals, "replace": timed.replace_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[10, 100])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--queues", type=int, default=4)
    args = parser.parse_args()
    logging.getLogger("dq").setLevel(logging.ERROR)  # the leader's sync-set notices
    base = tempfile.mkdtemp(prefix="dq-bench-resync-", dir=os.environ.get("DQ_BENCH_DIR"))
    load = os.getloadavg()
    print(f"# {platform.node()} {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print("| leader data | copied | resync (median, min-max) | of which replace_queues | MB/s |")
    print("| --- | --- | --- | --- | --- |")
    try:
        for mb in args.mb:
            r = _measure(mb, args.runs, args.queues, base)
            med = statistics.median(r["total"])
            print(
                f"| {mb} MiB of 1 KiB items | {r['bytes'] / 2**20:.1f} MiB | "
                f"{med:.2f} s ({min(r['total']):.2f}-{max(r['total']):.2f}) | "
                f"{statistics.median(r['replace']) * 1000:.0f} ms | {r['bytes'] / 2**20 / med:.0f} |",
                flush=True,
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    load = os.getloadavg()
    print(f"# load at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
