"""A failed freeze is retried until it succeeds, and no merge covers a log that has
not become a segment file yet (else recovery deletes it as covered: items lost, or
tombstones dropped and released items back)."""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release, file_jobs, fileio
from dq.storage.compactor import merge_segments
from dq.storage.errors import InvalidArgument, QueueDamaged, WriteStall
from dq.storage.merge_policy import MergePolicy
from tests.storage.conftest import FakeClock


@contextmanager
def failing(match: Callable[[str, str], bool]) -> Iterator[list[str]]:
    """Fail every step that ``match`` accepts with ENOSPC while the block runs."""
    seen: list[str] = []

    def hook(step: str, path: str) -> None:
        if match(step, path):
            seen.append(path)
            raise OSError(errno.ENOSPC, "No space left on device (injected)", path)

    fileio.FAULTS.append(hook)
    try:
        yield seen
    finally:
        fileio.FAULTS.remove(hook)


def seg_of(no: int) -> Callable[[str, str], bool]:
    return lambda step, path: step == "write" and f"{no:010d}-{no:010d}.seg" in path


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def drain(e: Engine, q: str) -> list[bytes]:
    out: list[bytes] = []
    while got := e.dequeue(q, 1000, 60_000):
        out += [d.value for d in got]
    return out


def test_a_failed_freeze_is_retried_until_it_succeeds(
    open_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a"), NewItem(b"b")])
    q = e.queue("q")
    with failing(seg_of(1)) as seen:
        e.freeze("q")
        wait_for(lambda: len(seen) >= 2)  # tried again, still failing
        assert len(q.files.frozen) == 1 and q.stats().extra["freeze_failures"] >= 2
    wait_for(lambda: not q.files.frozen)  # the fault cleared: the next retry installs it
    queue_dir = tmp_path / "data" / "queues" / "q"
    assert (queue_dir / "0000000001-0000000001.seg").exists()
    assert not list(queue_dir.glob("*.log_ro"))
    assert sorted(drain(e, "q")) == [b"a", b"b"]


def test_no_merge_spans_a_log_whose_freeze_failed(tmp_path: Path, clock: FakeClock) -> None:
    """Log 1 and log 3 become segment files; log 2 (an item and the tombstone of a
    released one) cannot. A full merge of the files must not claim log 2."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "data"
    e = Engine.open(path, cfg, clock=clock)
    try:
        e.enqueue("q", [NewItem(b"keep-1"), NewItem(b"gone-1")])
        e.freeze("q")  # 1-1.seg
        with failing(seg_of(2)):
            [d] = [d for d in e.dequeue("q", 2) if d.value == b"gone-1"] or [None]
            e.release("q", [Release(d.id, d.receipt)])  # its tombstone: log 2
            e.enqueue("q", [NewItem(b"keep-2"), NewItem(b"gone-2")])
            e.freeze("q")  # log 2's freeze fails (and keeps failing)
            e.enqueue("q", [NewItem(b"keep-3")])
            got = {x.value: x for x in e.dequeue("q", 10)}
            gone2 = got[b"gone-2"]
            e.release("q", [Release(gone2.id, gone2.receipt)])  # tombstone in log 3
            e.freeze("q")  # 3-3.seg
            q = e.queue("q")
            assert [(r.seg_lo, r.seg_hi) for r in q.segments] == [(1, 1), (3, 3)]
            with pytest.raises(InvalidArgument):
                q.merge(0, 2)  # would write 1-3.seg
            eager = MergePolicy(max_segments=0, fan_in=1)  # merges whatever it may
            assert eager.plan(q) == (0, 1)  # 1-1 alone: older than log 2
            assert MergePolicy(max_segments=0, fan_in=2).plan(q) is None
    finally:
        e.close()
    e = Engine.open(path, cfg, clock=clock)
    try:
        assert sorted(drain(e, "q")) == [b"keep-1", b"keep-2", b"keep-3"]
    finally:
        e.close()


def test_recovery_keeps_a_log_inside_a_merged_range(tmp_path: Path, clock: FakeClock) -> None:
    """A directory where a merged segment's range covers a log that still exists (left
    by an older version): the log is not deleted, the queue is quarantined."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "data"
    e = Engine.open(path, cfg, clock=clock)
    qdir = path / "queues" / "q"
    try:
        e.enqueue("q", [NewItem(b"one")])
        e.freeze("q")
        with failing(seg_of(2)):
            e.enqueue("q", [NewItem(b"two")])
            e.freeze("q")
            e.enqueue("q", [NewItem(b"three")])
            e.freeze("q")
            segs = [r.path for r in e.queue("q").segments]
            merge_segments(segs, str(qdir), drop_rogue=True)  # what the old policy did
    finally:
        e.close()
    assert (qdir / "0000000002.log_ro").exists() and (qdir / "0000000001-0000000003.seg").exists()
    e = Engine.open(path, cfg, clock=clock)
    try:
        assert (qdir / "0000000002.log_ro").exists()
        with pytest.raises(QueueDamaged) as err:
            e.dequeue("q")
        assert err.value.context["file"] == str(qdir / "0000000002.log_ro")
    finally:
        e.close()


def test_write_stall_clears_when_segment_writes_work_again(
    open_engine: Callable[..., Engine],
) -> None:
    e = open_engine(memseg_bytes=4096, max_frozen=1)
    value = os.urandom(500)
    stalled = False
    with failing(lambda step, path: step == "write" and path.endswith(".seg.tmp")):
        for _ in range(200):
            try:
                e.enqueue_nowait("q", [NewItem(value)]).result(5)
            except WriteStall:
                stalled = True
                break
    assert stalled
    deadline = time.monotonic() + 15
    while True:  # the fault is gone: the stall must clear without a restart
        try:
            e.enqueue_nowait("q", [NewItem(b"after")]).result(5)
            break
        except WriteStall:
            assert time.monotonic() < deadline, "the write stall never cleared"
            time.sleep(0.05)
    assert e.queue("q").failed is None


def test_a_failed_merge_backs_off_and_is_tried_again_once_the_disk_has_room(
    open_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """A merge that cannot write its output (a full disk) is not restarted at every
    maintenance tick: the policy waits 1 s, then 2 s ... before trying again, and the
    merge goes through once the disk has room."""
    e = open_engine(auto_merge=True)
    e.enqueue("q", [NewItem(b"item-%d" % i) for i in range(4)])
    e.freeze("q")  # 1-1.seg
    got = e.dequeue("q", 3)
    e.release("q", [Release(d.id, d.receipt) for d in got])
    q = e.queue("q")
    merged = "0000000001-0000000002.seg"
    with failing(lambda step, path: step == "write" and merged in path) as seen:
        e.freeze("q")  # 2-2.seg: the tombstones; the policy now merges both files
        wait_for(lambda: len(seen) >= 1)
        time.sleep(3.0)  # six maintenance ticks
        assert 1 <= len(seen) <= 3, seen
    assert "retrying in" in caplog.text
    wait_for(lambda: [(r.seg_lo, r.seg_hi) for r in q.segments] == [(1, 2)])
    assert drain(e, "q") == [b"item-3"]


def test_a_write_stall_behind_a_hung_worker_is_logged(
    open_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A compaction worker that hangs fails nothing, but writes are refused: the log
    says so (once a minute, not once a refusal) and names the cause."""
    gate = threading.Event()
    real = file_jobs.freeze_log

    def hung(*args: object, **kwargs: object) -> object:
        assert gate.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(file_jobs, "freeze_log", hung)
    e = open_engine(memseg_bytes=4096, max_frozen=1, compaction="thread")
    value = os.urandom(500)
    refused = 0
    with caplog.at_level(logging.WARNING, logger="dq.storage"):
        try:
            for _ in range(400):
                try:
                    e.enqueue_nowait("q", [NewItem(value)]).result(5)
                except WriteStall:
                    refused += 1
                    if refused == 20:
                        break
        finally:
            gate.set()
    assert refused == 20
    said = [r.getMessage() for r in caplog.records if "write_stall" in r.getMessage()]
    assert len(said) == 1, said
    assert "queue q: writes refused" in said[0] and "compaction worker" in said[0]


def test_a_move_by_key_waits_out_a_write_stall_under_the_same_rule(
    open_engine: Callable[..., Engine],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A move by key obeys the stall rule every write obeys: while the compaction
    worker hangs it waits (the warning names the cause, once), goes through once the
    worker goes on, and is refused with ``WriteStall`` if the stall outlasts its wait."""
    gate = threading.Event()
    real = file_jobs.freeze_log

    def hung(*args: object, **kwargs: object) -> object:
        assert gate.wait(30)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(file_jobs, "freeze_log", hung)
    e = open_engine(memseg_bytes=4096, max_frozen=1, compaction="thread", wait_timeout_s=0.3)
    first = e.enqueue("q", [NewItem(b"keyed", key="k")])[0]
    value = os.urandom(500)
    try:
        with caplog.at_level(logging.WARNING, logger="dq.storage"):
            for _ in range(400):
                try:
                    e.enqueue_nowait("q", [NewItem(value)]).result(5)
                except WriteStall:
                    break
            else:
                pytest.fail("the hung worker never stalled the writes")
            with pytest.raises(WriteStall):  # the stall outlasts the move's wait
                e.patch_key("q", "k", delay_ms=60_000)
        said = [r.getMessage() for r in caplog.records if "write_stall" in r.getMessage()]
        assert len(said) == 1 and "compaction worker" in said[0], said
        monkeypatch.setattr(e, "config", dataclasses.replace(e.config, wait_timeout_s=30.0))
        moved: list[object] = []
        mover = threading.Thread(
            target=lambda: moved.append(e.patch_key("q", "k", delay_ms=60_000)), daemon=True
        )
        mover.start()
        mover.join(0.5)
        assert mover.is_alive() and not moved  # waiting the stall out
        gate.set()
        mover.join(30)
        assert not mover.is_alive()
    finally:
        gate.set()
    (done,) = moved
    assert done.id == first.id and done.deadline >= first.deadline + 59_000  # type: ignore[attr-defined]
    assert e.peek_key("q", "k").id == first.id
