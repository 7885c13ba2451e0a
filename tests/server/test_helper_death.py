"""SIGKILL the server's helper processes (the compaction workers) again and again under load.

A real ``dq serve`` takes batches of incompressible 64 KiB values, so its 16 MiB logs
rotate every few seconds and freezes and merges keep its freeze and merge worker
processes busy; a killer SIGKILLs a worker it sees using the CPU (in the middle of a
job), again and again. Then:

1. the server keeps answering: no client sees anything but 200 (a helper's death is
   the server's business, not the client's);
2. once the killing stops, every frozen log gets its segment file (failed freezes are
   retried: ``freeze_failures`` counts them, ``frozen`` returns to 0);
3. after a SIGKILL of the server and a restart, every acknowledged, unreleased item is
   there with its value and no acknowledged release came back.
"""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.server.faultload import Load, check_restart, wait_for
from tests.server.live import LiveServer

# integration: a live dq serve and its helper processes
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUE = "helpers"
KILLS = 5
WAIT_S = 90.0


def _helpers(server: LiveServer) -> list[psutil.Process]:
    assert server.proc is not None
    try:
        children = psutil.Process(server.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    out = []
    for child in children:
        try:
            if "dq.storage.worker" in " ".join(child.cmdline()):
                out.append(child)
        except psutil.NoSuchProcess:
            continue
    return out


def _busy(helpers: list[psutil.Process]) -> list[psutil.Process]:
    """The helpers that used CPU during the last 50 ms: working on a job."""

    def cpu(p: psutil.Process) -> float:
        try:
            t = p.cpu_times()
            return float(t.user + t.system)
        except psutil.NoSuchProcess:
            return -1.0

    before = {p.pid: cpu(p) for p in helpers}
    time.sleep(0.05)
    return [p for p in helpers if cpu(p) > before[p.pid] >= 0]


def _extra(url: str) -> dict[str, int]:
    r = httpx.get(f"{url}/v1/queues/{QUEUE}", timeout=30)
    assert r.status_code == 200, r.text
    extra: dict[str, int] = r.json()["stats"]["extra"]
    return extra


def test_helpers_killed_under_load_lose_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = LiveServer(data, fsync="always").start()
    load = Load(server.url, QUEUE, value_bytes=64 << 10, batch=8).start()
    rng = random.Random()
    kills = 0
    try:
        wait_for("a first helper", lambda: bool(_helpers(server)), WAIT_S)
        give_up = time.monotonic() + WAIT_S
        while kills < KILLS:
            assert time.monotonic() < give_up, f"only {kills} helpers to kill in {WAIT_S} s"
            busy = _busy(_helpers(server))
            if busy:
                try:
                    rng.choice(busy).send_signal(signal.SIGKILL)
                    kills += 1
                except psutil.NoSuchProcess:
                    pass
                time.sleep(rng.uniform(0.1, 0.4))
        assert server.proc is not None and server.proc.poll() is None, "the server died"
        wait_for(
            "every frozen log in a segment file",
            lambda: _extra(server.url).get("frozen", 0) == 0,
            WAIT_S,
        )
        extra = _extra(server.url)
        assert extra.get("freeze_failures", 0) > 0, f"no kill hit a freeze: {extra}"
        assert extra.get("io_errors", 0) == 0, extra
        before = len(load.acked)
        wait_for("acknowledgements after the kills", lambda: len(load.acked) > before, WAIT_S)
        server.kill()
        load.join()
    finally:
        load.stop.set()
        server.kill()
    assert not load.refusals(), f"clients saw errors while helpers died: {load.refusals()}"
    again = LiveServer(data, fsync="always").start()
    try:
        check_restart(again.url, load)
    finally:
        again.kill()
