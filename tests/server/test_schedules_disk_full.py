"""Schedules on a real disk that fills up, then gets space back, then a SIGKILL.

The data directory lives on a size-limited tmpfs (``test_disk_full.py``'s fixture; root
only). The test fills it to the last byte; the ticks due meanwhile cannot be written
(their writes are refused and counted in ``/metrics``), then a filler is deleted, the
server catches up by itself, and after a SIGKILL and a restart every tick up to the kill
is in the queue exactly once: none lost to the full disk, none doubled by its retries.
The schedule's queue keeps no idempotency keys, so only the progress written with each
tick can keep a retried tick from landing twice; its ``catch_up`` is ``skip``, so a tick
delayed by the full disk would be lost were it taken for one missed while down.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.server.faultload import wait_for
from tests.server.live import LiveServer, browse_all
from tests.server.test_disk_full import FILLER_BYTES, small_fs  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Q = "ticks"
WAIT_S = 90.0


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _last_tick(url: str) -> int:
    doc = httpx.get(f"{url}/v1/queues/{Q}/schedules/beat", timeout=10).json()
    return int(doc["last_tick"] or 0)


def _fill(path: Path) -> None:
    """Write ``path`` until the file system has no byte left."""
    chunk = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError:
                return
    finally:
        os.close(fd)


def test_no_tick_lost_or_doubled_through_a_full_disk(
    small_fs: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    filler = small_fs / "filler"
    filler.write_bytes(os.urandom(FILLER_BYTES))
    data = small_fs / "data"
    server = LiveServer(data, fsync="always", env={"DQ_SCHEDULE_MIN_EVERY_MS": "100"})
    server.log_path = tmp_path / "server.log"
    server.start()
    try:
        r = httpx.put(f"{server.url}/v1/queues/{Q}", json={"dedup_window_ms": 0}, timeout=30)
        assert r.status_code == 200, r.text
        r = httpx.put(
            f"{server.url}/v1/queues/{Q}/schedules/beat",
            json={"every_ms": 100, "catch_up": "skip"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        time.sleep(0.5)
        _fill(small_fs / "rest")
        wait_for(
            "tick writes refused by the full disk",
            lambda: _metric(server.url, "dq_schedule_write_failures_total") >= 2,
            WAIT_S,
            lambda: server.log()[-1500:],
        )
        full_at = int(time.time() * 1000)
        time.sleep(1.0)  # ticks keep coming due while the disk is full
        filler.unlink()
        wait_for(
            "the ticks due meanwhile to be written",
            lambda: _last_tick(server.url) > full_at + 1500,
            WAIT_S,
            lambda: server.log()[-1500:],
        )
        time.sleep(0.5)
        killed_at = int(time.time() * 1000)
        server.kill()
    finally:
        server.kill()
    again = LiveServer(data, fsync="always", env={"DQ_SCHEDULE_MIN_EVERY_MS": "100"})
    again.log_path = tmp_path / "server-again.log"
    again.start()
    try:
        ticks = [i["deadline"] for i in browse_all(again.url, Q)]
        assert len(ticks) == len(set(ticks)), "a tick twice"
        # the ticks missed while it was down are skipped: look up to the kill
        ticks = sorted(t for t in ticks if t < killed_at - 300)
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 100)), "a tick lost"
        assert ticks[0] < full_at - 1000 and ticks[-1] > full_at + 1500
    finally:
        again.kill()
