"""Nothing is acknowledged or handed out before its log record is synced (``fsync="always"``).

A ``fileio.FAULTS`` hook holds the log's fsync: while it is held, the write must stay
unanswered and a dequeue must hand out nothing it carries; once the fsync returns, both
happen. An engine that skips the sync, or publishes a batch before syncing it, fails
here deterministically (a SIGKILL test cannot see either: the page cache survives).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dq.storage import Engine, NewItem, QueueConfig, Release, fileio

HOLD_S = 0.3


class HeldSync:
    """Blocks every fsync of a ``*.log`` until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.go = threading.Event()

    def __call__(self, step: str, path: str) -> None:
        if step == "fsync" and path.endswith(".log"):
            self.entered.set()
            assert self.go.wait(30), "the test never let the fsync go"


@contextmanager
def held_sync() -> Iterator[HeldSync]:
    hold = HeldSync()
    fileio.FAULTS.append(hold)
    try:
        yield hold
    finally:
        hold.go.set()
        fileio.FAULTS.remove(hold)


def _engine(open_engine: Callable[..., Engine]) -> Engine:
    engine: Engine = open_engine(fsync="always")
    engine.put_queue("q", QueueConfig())  # creating the queue syncs before the hold
    return engine


def test_enqueue_waits_for_its_fsync_and_stays_invisible(
    open_engine: Callable[..., Engine],
) -> None:
    engine = _engine(open_engine)
    with held_sync() as hold:
        fut = engine.enqueue_nowait("q", [NewItem(b"a"), NewItem(b"b")])
        assert hold.entered.wait(10), "the enqueue never synced its log"
        time.sleep(HOLD_S)
        assert not fut.done(), "the enqueue was acknowledged before its fsync returned"
        assert engine.dequeue("q", 10, 60_000) == [], "dequeue handed out an unsynced item"
        assert engine.stats("q").due == 0
        hold.go.set()
        got = fut.result(10)
    assert [g.id for g in got] == [1, 2]
    assert [d.value for d in engine.dequeue("q", 10, 60_000)] == [b"a", b"b"]


def test_release_waits_for_its_fsync(open_engine: Callable[..., Engine]) -> None:
    engine = _engine(open_engine)
    engine.enqueue("q", [NewItem(b"a")])
    (d,) = engine.dequeue("q", 1, 60_000)
    with held_sync() as hold:
        fut = engine.release_nowait("q", [Release(d.id, d.receipt)])
        assert hold.entered.wait(10), "the release never synced its log"
        time.sleep(HOLD_S)
        assert not fut.done(), "the release was acknowledged before its fsync returned"
        hold.go.set()
        assert fut.result(10)[0].ok
    assert engine.stats("q").pending == 0


def test_a_later_enqueue_is_not_visible_before_an_earlier_sync(
    open_engine: Callable[..., Engine],
) -> None:
    """Group commit: a batch appended while a sync is held rides on the next sync; none
    of the batches may show before the sync that covers it returns."""
    engine = _engine(open_engine)
    with held_sync() as hold:
        first = engine.enqueue_nowait("q", [NewItem(b"first")])
        assert hold.entered.wait(10)
        second = engine.enqueue_nowait("q", [NewItem(b"second")])
        time.sleep(HOLD_S)
        assert not first.done() and not second.done()
        assert engine.dequeue("q", 10, 60_000) == []
        hold.go.set()
        first.result(10)
        second.result(10)
    assert [d.value for d in engine.dequeue("q", 10, 60_000)] == [b"first", b"second"]
