"""Log rotation is all or nothing: a failure starting the next log leaves the queue on
its current log, still writable; a failure closing the current log fails the queue.
Either way every waiter is answered and no write lands in a closed (or reused)
descriptor."""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, Enqueued, NewItem, fileio
from dq.storage.errors import EngineUnavailable, StorageError, WriteStall
from tests.storage.conftest import FakeClock


@contextmanager
def hooked(hook: Callable[[str, str], None]) -> Iterator[None]:
    fileio.FAULTS.append(hook)
    try:
        yield
    finally:
        fileio.FAULTS.remove(hook)


def fail_next_log_once() -> Callable[[str, str], None]:
    """ENOSPC creating log 2, the first time only (a transient fault)."""
    fired = []

    def hook(step: str, path: str) -> None:
        if not fired and step == "write" and path.endswith("0000000002.log.tmp"):
            fired.append(path)
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

    return hook


def retry_until_served(call: Callable[[], list[Enqueued]], timeout: float = 10.0) -> list[Enqueued]:
    """What a client does with 503: try again shortly."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except EngineUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def drain(e: Engine, q: str) -> list[bytes]:
    out: list[bytes] = []
    while got := e.dequeue(q, 1000, 60_000):
        out += [d.value for d in got]
    return out


def write_concurrently(e: Engine, queue: str, values: list[bytes]) -> dict[bytes, object]:
    """Submit every write at once; wait (bounded) for every answer."""
    outcome: dict[bytes, object] = {}
    futures: list[tuple[bytes, Future[list[Enqueued]]]] = []
    lock = threading.Lock()

    def submit(v: bytes) -> None:
        give_up = time.monotonic() + 10
        while True:
            try:
                fut = e.enqueue_nowait(queue, [NewItem(v)])
                break
            except WriteStall:  # 503 "retry shortly", while the rotation waits to retry
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.01)
            except StorageError as exc:
                outcome[v] = exc
                return
        with lock:
            futures.append((v, fut))

    threads = [threading.Thread(target=submit, args=(v,)) for v in values]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    for v, fut in futures:
        try:
            outcome[v] = fut.result(timeout=10)  # a waiter left unanswered fails here
        except StorageError as exc:
            outcome[v] = exc
    return outcome


@pytest.mark.parametrize("mode", ["always", "interval", "never"])
def test_a_failed_next_log_leaves_the_queue_on_its_log(
    tmp_path: Path, clock: FakeClock, mode: str
) -> None:
    cfg = EngineConfig(
        fsync=mode, compaction="inline", auto_merge=False, memseg_bytes=4096, max_frozen=4
    )
    path = tmp_path / "data"
    e = Engine.open(path, cfg, clock=clock)
    values = [b"%02d-" % i + os.urandom(400) for i in range(16)]
    try:
        with hooked(fail_next_log_once()):
            outcome = write_concurrently(e, "q", values)
        assert all(isinstance(o, list) for o in outcome.values()), outcome
        assert e.queue("q").failed is None
        assert e.stats("q").extra["rotation_failures"] == 1
        e.enqueue("other", [NewItem(b"other-1")])  # a new log: a new descriptor
        more = [b"more-%d" % i + os.urandom(400) for i in range(16)]
        for v in more:
            e.enqueue("q", [NewItem(v)])
        e.enqueue("other", [NewItem(b"other-2")])
        assert len(e.queue("q").segments) + len(e.queue("q").files.frozen) >= 1  # rotated since
    finally:
        e.close()
    e = Engine.open(path, cfg, clock=clock)
    try:
        assert sorted(drain(e, "q")) == sorted(values + more)
        assert sorted(drain(e, "other")) == [b"other-1", b"other-2"]
    finally:
        e.close()


def test_a_failed_close_at_rotation_fails_the_queue_and_answers_everyone(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = EngineConfig(fsync="always", compaction="inline", auto_merge=False, memseg_bytes=4096)
    path = tmp_path / "data"
    e = Engine.open(path, cfg, clock=clock)
    armed = threading.Event()
    broken = threading.Event()

    def hook(step: str, path: str) -> None:
        if step == "write" and path.endswith("0000000002.log.tmp"):
            armed.set()  # rotation has begun: the close of log 1 comes next
        if (
            armed.is_set()
            and not broken.is_set()
            and step == "fsync"
            and path.endswith("0000000001.log")
        ):
            raise OSError(errno.EIO, "Input/output error (injected)", path)

    values = [b"%02d-" % i + os.urandom(400) for i in range(24)]
    try:
        with caplog.at_level(logging.ERROR), hooked(hook):
            outcome = write_concurrently(e, "q", values)
            assert armed.is_set()
            stats = e.stats("q")
            assert stats.extra["failed"] == 1 and stats.extra["io_errors"] == 1
            with pytest.raises(EngineUnavailable):  # nothing is acknowledged after
                e.enqueue_nowait("q", [NewItem(b"refused")]).result(10)
            assert any("closing the log" in r.getMessage() for r in caplog.records)
            broken.set()  # the fault clears
        done = retry_until_served(lambda: e.enqueue("q", [NewItem(b"after")]))
        assert done[0].id > 0 and e.queue("q").failed is None
        assert e.stats("q").extra["recoveries"] == 1
    finally:
        e.close()
    acked = {v for v, o in outcome.items() if isinstance(o, list)}
    refused = {v for v, o in outcome.items() if isinstance(o, EngineUnavailable | StorageError)}
    assert acked | refused == set(values) and refused
    e = Engine.open(path, cfg, clock=clock)
    try:
        got = drain(e, "q")
        assert sorted(got) == sorted(acked | {b"after"})
    finally:
        e.close()


def test_a_freeze_tries_a_failed_next_log_again_and_rotates(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """``Engine.freeze`` (``always``): the next log cannot be created once (ENOSPC); the
    rotation backs off 50 ms and the freeze has it tried again, so the log is frozen when
    the freeze returns (it used to wait out its whole timeout for a round no write
    brought, and return with the log unrotated)."""
    cfg = EngineConfig(fsync="always", compaction="inline", auto_merge=False)
    e = Engine.open(tmp_path / "data", cfg, clock=clock)
    try:
        e.enqueue("q", [NewItem(b"one")])
        q = e.queue("q")
        with caplog.at_level(logging.WARNING), hooked(fail_next_log_once()):
            q.freeze_now(timeout=10)
        assert any("could not start log 2" in r.getMessage() for r in caplog.records)
        assert not q.files.rotate_requested
        assert e.stats("q").extra["rotation_failures"] == 1
        e.compactor.wait_idle(timeout=30)
        assert len(q.segments) == 1 and q.failed is None
        assert [d.value for d in e.dequeue("q", 10, 60_000)] == [b"one"]
    finally:
        e.close()


def test_a_freeze_whose_log_cannot_be_closed_raises_the_queues_failure(
    tmp_path: Path, clock: FakeClock
) -> None:
    """The log's sync fails in the freeze's round: the queue fails and will not rotate,
    so the freeze raises that failure at once instead of waiting out its timeout."""
    cfg = EngineConfig(fsync="always", compaction="inline", auto_merge=False)
    e = Engine.open(tmp_path / "data", cfg, clock=clock)
    fired: list[str] = []

    def hook(step: str, path: str) -> None:
        if not fired and step == "fsync" and path.endswith("0000000001.log"):
            fired.append(path)
            raise OSError(errno.EIO, "Input/output error (injected)", path)

    try:
        e.enqueue("q", [NewItem(b"one")])
        q = e.queue("q")
        with hooked(hook), pytest.raises(EngineUnavailable):
            q.freeze_now(timeout=10)
        assert fired and q.failed is not None
    finally:
        e.close()
