"""A closed engine, and a deleted queue, let go of their memory at once.

A server reopens engines and queues in its process (a follower's resync replaces its
queues, tests and tools open and close engines, a benchmark reopens its backlog): what
it closed must go as soon as nothing names it, not at the next run of the cycle
collector. That run may be far off: the engine's bulk (in-memory segments, the delivery
index, the in-flight set) is compiled and allocates no tracked Python objects, so a
filled process that reopened its backlog held every closed engine, with the in-memory
segments and readers of its queues, until the end (``bench/NOTES.md``, "A closed
engine freed at once"). So these tests run with the cycle collector off: a reference
cycle through the engine, a queue or one of a queue's parts keeps the object alive and
fails them.
"""

from __future__ import annotations

import gc
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release, Requeue
from dq.storage.events import Event
from tests.storage.conftest import FakeClock


@pytest.fixture(autouse=True)
def no_cycle_collector() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Subscriber:
    """What a server's publisher is: an object holding the engine that subscribed one of
    its methods to the engine's events and schedule changes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events = 0
        engine.on_event(self.on_event)
        engine.on_schedule_change(self.on_change)

    def on_event(self, event: Event) -> None:
        self.events += 1

    def on_change(self, queue: str, name: str | None) -> None:
        pass


def _use(e: Engine) -> None:
    """Enqueue, dequeue, release and requeue over groups; freeze a log into a segment
    file and merge segment files; leave a lease and a held item in the delivery index."""
    e.put_queue("q", QueueConfig(group_limit=1, max_deliveries=3))
    for _ in range(3):
        e.enqueue("q", [NewItem(b"v" * 100, group=f"g{i % 5}") for i in range(40)])
        got = e.dequeue("q", 10, 60_000)
        e.release("q", [Release(d.id, d.receipt) for d in got[:3]])
        e.requeue("q", [Requeue(d.id, d.receipt, delay_ms=0) for d in got[3:6]])
        e.freeze("q")
    assert e.queue("q").merge(0, 2, wait=True) is not None
    e.enqueue("q", [NewItem(b"left in the log", group="g1")])
    e.dequeue("q", 10, 60_000)


def _open(path: Path, clock: FakeClock, **overrides: Any) -> Engine:
    cfg = {"fsync": "always", "compaction": "thread", "auto_merge": False, **overrides}
    return Engine.open(path, EngineConfig(**cfg), clock=clock)


def test_a_closed_engine_is_freed_when_its_last_name_goes(tmp_path: Path) -> None:
    clock = FakeClock()
    e = _open(tmp_path / "data", clock)
    Subscriber(e)  # held only through the engine's own lists
    _use(e)
    e.watch("q", lambda: None)
    q = e.queue("q")
    # a retry waiting on the queue's timers (a failed freeze's, a dead letter's)
    q.call_later(60.0, q.jobs.merge_idle)
    parts = [weakref.ref(x) for x in (e, q, q.jobs, q.files, q.deliveries, q.commit)]
    parts += [weakref.ref(r) for r in q.segments]
    assert q.segments, "the scenario left no segment file to watch"
    e.close()
    del e, q
    alive = [type(r()).__name__ for r in parts if r() is not None]
    assert alive == [], f"still alive after close and del, without the cycle collector: {alive}"


def test_engines_reopened_in_one_process_do_not_pile_up(tmp_path: Path) -> None:
    """bench/scale.py's close and three reopens of the same directory."""
    clock = FakeClock()
    e = _open(tmp_path / "data", clock)
    _use(e)
    refs = [weakref.ref(e)]
    e.close()
    for _ in range(3):
        e = _open(tmp_path / "data", clock)
        refs.append(weakref.ref(e))
        assert e.dequeue("q", 100, 60_000)  # the reopened engine serves the backlog
        e.close()
    del e
    assert [r() is None for r in refs] == [True] * 4


def test_a_deleted_queue_is_freed_at_once(tmp_path: Path) -> None:
    clock = FakeClock()
    e = _open(tmp_path / "data", clock)
    try:
        _use(e)
        q = e.queue("q")
        refs = [weakref.ref(x) for x in (q, q.jobs, q.files, *q.segments)]
        del q
        time.sleep(0.7)  # the maintenance thread's pass (every 0.5 s) saw the queue
        e.delete_queue("q")  # its last write's sync round named it too
        assert [r() is None for r in refs] == [True] * len(refs)
        assert e.list_queues() == []
    finally:
        e.close()


def test_the_queues_a_follower_replaces_are_freed_at_once(tmp_path: Path) -> None:
    """A follower's resync (``replace_queues``) closes every queue and opens the
    leader's copy in their place: the replaced queues must not stay beside the copy."""
    clock = FakeClock()
    e = _open(tmp_path / "data", clock)
    try:
        _use(e)
        copy = str(tmp_path / "data" / ".replica-copy")
        e.snapshot(copy)
        q = e.queue("q")
        refs = [weakref.ref(x) for x in (q, q.jobs, q.files, *q.segments)]
        del q
        e.set_role(False, None)
        e.replace_queues(copy)
        assert [r() is None for r in refs] == [True] * len(refs)
        assert e.list_queues() == ["q"] and e.queue("q").segments
    finally:
        e.close()
