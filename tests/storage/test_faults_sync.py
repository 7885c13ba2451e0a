"""Any write or fsync error, in any mode and on any path, fails the queue: it is
logged, answered with ``EngineUnavailable`` (503), shown in stats, and nothing written
after it is acknowledged. A refused operation never happens later."""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Requeue, fileio
from dq.storage.errors import EngineUnavailable, StorageError, StorageFull
from tests.storage.conftest import FakeClock


@contextmanager
def hooked(hook: Callable[[str, str], None]) -> Iterator[None]:
    fileio.FAULTS.append(hook)
    try:
        yield
    finally:
        fileio.FAULTS.remove(hook)


def eio_on(step_name: str) -> Callable[[str, str], None]:
    def hook(step: str, path: str) -> None:
        if step == step_name and path.endswith(".log"):
            raise OSError(errno.EIO, "Input/output error (injected)", path)

    return hook


def drain(e: Engine, q: str) -> list[bytes]:
    out: list[bytes] = []
    while got := e.dequeue(q, 1000, 60_000):
        out += [d.value for d in got]
    return out


def test_an_interval_fsync_error_fails_the_queue_loudly(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = EngineConfig(fsync="interval", fsync_interval_ms=10, compaction="inline")
    with Engine.open(tmp_path / "d", cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"before")])
        with caplog.at_level(logging.ERROR), hooked(eio_on("fsync")):
            e.enqueue("q", [NewItem(b"unsynced")])  # acknowledged once written (interval)
            deadline = time.monotonic() + 10
            while e.stats("q").extra["failed"] == 0:
                assert time.monotonic() < deadline, "the fsync error was swallowed"
                time.sleep(0.01)
            assert e.stats("q").extra["io_errors"] == 1
            with pytest.raises(EngineUnavailable):
                e.enqueue("q", [NewItem(b"refused")])
            assert any("syncing the log failed" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("step", ["write", "fsync"])
def test_a_group_commit_error_is_answered_503_and_fails_the_queue(
    tmp_path: Path, clock: FakeClock, step: str
) -> None:
    cfg = EngineConfig(fsync="always", compaction="inline", auto_merge=False)
    with Engine.open(tmp_path / "d", cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"before")])
        with hooked(eio_on(step)):
            with pytest.raises(EngineUnavailable):  # not a bare OSError (HTTP 500)
                e.enqueue_nowait("q", [NewItem(b"lost")]).result(10)
            with pytest.raises(EngineUnavailable):
                e.enqueue_nowait("q", [NewItem(b"refused")]).result(10)
            assert e.stats("q").extra["failed"] == 1
        for _ in range(200):  # the fault is gone: the queue reopens from disk
            try:
                e.enqueue("q", [NewItem(b"after")])
                break
            except EngineUnavailable:
                time.sleep(0.05)
        assert sorted(drain(e, "q")) == [b"after", b"before"]


@pytest.mark.parametrize("mode", ["always", "interval", "never"])
def test_a_refused_requeue_does_not_happen_later(
    tmp_path: Path, clock: FakeClock, mode: str
) -> None:
    """A requeue buffered behind a write that fails is refused (507/503) and must not be
    written by the next sync (the fault was transient: that sync succeeds): after a
    restart the item is where it was."""
    cfg = EngineConfig(fsync=mode, compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    e = Engine.open(path, cfg, clock=clock)
    try:
        e.enqueue("q", [NewItem(b"job")])
        [d] = e.dequeue("q")
        entered, gate = threading.Event(), threading.Event()
        armed = [True]

        def hook(step: str, path: str) -> None:  # one transient failure
            if armed[0] and step == "write" and path.endswith(".log"):
                armed[0] = False
                entered.set()
                gate.wait(10)
                raise StorageFull("no space left on device (injected)", file=path)

        with hooked(hook):
            if mode == "always":
                blocker = e.enqueue_nowait("q", [NewItem(b"first")])  # the syncer waits in write
                assert entered.wait(10)
                refused = e.requeue_nowait("q", [Requeue(d.id, d.receipt, delay_ms=3_600_000)])
                gate.set()
                for fut in (blocker, refused):
                    with pytest.raises(StorageError):
                        fut.result(10)
            else:
                gate.set()
                with pytest.raises(StorageError):
                    e.requeue("q", [Requeue(d.id, d.receipt, delay_ms=3_600_000)])
        for _ in range(200):
            try:
                e.enqueue("q", [NewItem(b"after")])
                break
            except EngineUnavailable:
                time.sleep(0.05)
    finally:
        e.close()
    e = Engine.open(path, cfg, clock=clock)
    try:
        assert sorted(drain(e, "q")) == [b"after", b"job"]  # "job" still due now
    finally:
        e.close()


def test_a_fault_that_does_not_clear_backs_off_reopens(tmp_path: Path, clock: FakeClock) -> None:
    """Each reopen starts a new log: a queue failing again right after every reopen (a
    disk that stays full) must back off, not reopen on every request and leave a new
    log file per request."""
    cfg = EngineConfig(fsync="always", compaction="inline")
    with Engine.open(tmp_path / "d", cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"before")])
        attempts = 0
        written: set[str] = set()

        def full(step: str, path: str) -> None:
            """Syncing written log bytes fails; a reopen (cutting the log back, starting
            a new log) succeeds: a disk with room for a new file but not for data."""
            if path.endswith(".log") and step == "write":
                written.add(path)
            elif path.endswith(".log") and step == "fsync" and path in written:
                written.discard(path)
                raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

        with hooked(full):
            give_up = time.monotonic() + 1.0
            while time.monotonic() < give_up:
                attempts += 1
                with pytest.raises(StorageError):
                    e.enqueue("q", [NewItem(b"refused")], timeout=5)
        recoveries = e.stats("q").extra["recoveries"]
        assert attempts > 50, "the loop did not try often enough to tell"
        assert recoveries <= 6, f"{recoveries} reopens in 1 s of a fault that never cleared"
        deadline = time.monotonic() + 15
        while True:  # the fault cleared: the queue comes back within the backoff
            try:
                e.enqueue("q", [NewItem(b"after")], timeout=5)
                break
            except StorageError:
                assert time.monotonic() < deadline, "the queue never reopened"
                time.sleep(0.05)
        assert sorted(drain(e, "q")) == [b"after", b"before"]
