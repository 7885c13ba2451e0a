"""A real disk filling up under a real server, then freed, then a SIGKILL.

The data directory lives on a size-limited tmpfs mounted for this test (root only; the
test skips with the reason otherwise). Producers enqueue incompressible values over
HTTP until the file system is full, while a consumer releases what it gets. Then:

1. every refusal while the disk was full is 507 or 503 — never a 500, never a hang;
2. a filler file is deleted and the server serves again by itself (no restart);
3. the server is SIGKILLed and started again: every acknowledged enqueue that was not
   released is there with its value, and no acknowledged release came back.

On tmpfs the page cache is the disk, so step 3 checks exactly that nothing was
acknowledged that did not reach the file system.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.faultload import Load, check_restart, enqueue_ok, wait_for
from tests.server.live import LiveServer

# integration: a live dq serve
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

QUEUE = "full"
FS_BYTES = 32 << 20
FILLER_BYTES = 8 << 20
VALUE_BYTES = 64 << 10
BATCH = 8
WAIT_S = 90.0


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mnt = tmp_path / "fs"
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=30)


def test_disk_full_refuses_cleanly_recovers_and_keeps_every_acknowledgement(
    small_fs: Path, tmp_path: Path
) -> None:
    filler = small_fs / "filler"
    filler.write_bytes(os.urandom(FILLER_BYTES))
    data = small_fs / "data"
    server = LiveServer(data, fsync="always")
    server.log_path = tmp_path / "server.log"  # the server's own log stays off the small disk
    server.start()
    load = Load(server.url, QUEUE, value_bytes=VALUE_BYTES, batch=BATCH).start()
    try:
        wait_for("a full disk", lambda: sum(load.refusals().values()) >= 5, WAIT_S)
        assert set(load.refusals()) <= {503, 507}, f"answers on a full disk: {load.refusals()}"
        filler.unlink()
        wait_for("recovery once space is free", lambda: enqueue_ok(server.url, QUEUE), WAIT_S)
        before = len(load.acked)
        wait_for(
            "acknowledgements after recovery",
            lambda: len(load.acked) > before,
            WAIT_S,
            lambda: f"{load.describe()}; server log: {server.log()[-1500:]}",
        )
        server.kill()
        load.join()
    finally:
        load.stop.set()
        server.kill()
    assert set(load.refusals()) <= {503, 507}, f"refusals other than 503/507: {load.refusals()}"
    again = LiveServer(data, fsync="always")
    again.log_path = tmp_path / "server-again.log"
    again.start()
    try:
        check_restart(again.url, load)
    finally:
        again.kill()
