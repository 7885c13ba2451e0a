"""A dequeue never passes the first key of a write still being synced (``fsync="always"``).

``docs/storage.md``: until a batch is published its smallest key is a barrier dequeue
does not pass. Without it, an item is lost until the next restart: B (due) is
published, A (due, sorting before B) is enqueued and its log's fsync is still running,
a dequeue hands out B and moves the cursor past A's key; once synced, A lies behind the
cursor, where dequeue never looks, while stats still count it pending.

Each test holds the log's fsync (``held_sync.SyncGate``), dequeues while it is held,
lets it go, and checks that nothing was handed out past the write in flight and nothing
is lost after it: an enqueue, a requeue, and the tombstones of a purge, a delete and a
redrive (which bars its items while their copies are written elsewhere, and again while
their removal is).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from dq.storage import Engine, NewItem, QueueConfig, Requeue
from tests.storage.conftest import FakeClock
from tests.storage.held_sync import gated_syncs

ANSWER_S = 10.0
LEASE_MS = 60_000


def _engine(open_engine: Callable[..., Engine]) -> Engine:
    engine: Engine = open_engine(fsync="always")
    engine.put_queue("q", QueueConfig(max_deliveries=5))  # its dead letters go to q.dlq
    return engine


def _taken(engine: Engine, queue: str = "q") -> list[tuple[bytes, int]]:
    return [(d.value, d.deadline) for d in engine.dequeue(queue, 10, LEASE_MS)]


def test_an_enqueue_being_synced_bars_dequeue_from_the_items_after_it(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    engine = _engine(open_engine)
    now = clock.now
    engine.enqueue("q", [NewItem(b"B", deadline=now - 10)])
    with gated_syncs() as gate:
        fut = engine.enqueue_nowait("q", [NewItem(b"A", deadline=now - 50)])
        assert gate.wait_arrived(1), "the enqueue never synced its log"
        during = _taken(engine)
        gate.open()
        fut.result(ANSWER_S)
    assert during == [], "a dequeue passed the key of an enqueue still being synced"
    assert _taken(engine) == [(b"A", now - 50), (b"B", now - 10)]
    assert engine.stats("q").pending == 2


def test_a_requeue_being_synced_bars_dequeue_from_the_items_after_it(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    engine = _engine(open_engine)
    now = clock.now
    engine.enqueue("q", [NewItem(b"A", deadline=now - 100), NewItem(b"B", deadline=now - 10)])
    (a,) = engine.dequeue("q", 1, LEASE_MS)  # the cursor is at A's first key
    with gated_syncs() as gate:
        fut = engine.requeue_nowait("q", [Requeue(a.id, a.receipt, deadline=now - 50)])
        assert gate.wait_arrived(1), "the requeue never synced its log"
        during = _taken(engine)
        gate.open()
        (moved,) = fut.result(ANSWER_S)
    assert moved.ok and moved.deadline == now - 50, moved
    assert during == [], "a dequeue passed the key of a requeue still being synced"
    assert _taken(engine) == [(b"A", now - 50), (b"B", now - 10)]


@pytest.mark.parametrize("op", ["purge", "delete"])
def test_a_removal_being_synced_bars_dequeue_from_its_items(
    open_engine: Callable[..., Engine], clock: FakeClock, op: str
) -> None:
    """Purge and delete tombstone items ahead of the cursor: no consumer may lease one
    while its removal is on its way to disk."""
    engine = _engine(open_engine)
    now = clock.now
    a, _b = engine.enqueue("q", [NewItem(b"A", deadline=now - 50), NewItem(b"B", deadline=now)])
    with ThreadPoolExecutor(1) as pool, gated_syncs() as gate:
        if op == "purge":
            removing = pool.submit(engine.purge, "q")
        else:
            removing = pool.submit(engine.delete_item, "q", a.id)
        assert gate.wait_arrived(1), f"the {op} never synced its log"
        during = _taken(engine)
        gate.open()
        removing.result(ANSWER_S)
    assert during == [], f"a dequeue handed out items whose {op} was still being synced"
    if op == "purge":
        assert _taken(engine) == [] and engine.stats("q").pending == 0
    else:
        assert _taken(engine) == [(b"B", now)] and engine.stats("q").pending == 1


def test_a_redrive_bars_dequeue_while_its_copies_and_its_removal_are_synced(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """Redrive writes the copy in the target queue, then tombstones the item in the
    dead-letter queue ahead of its cursor; through both syncs the dead-letter queue
    hands out neither the item nor anything after it."""
    engine = _engine(open_engine)
    engine.put_queue("q.dlq", QueueConfig())
    now = clock.now
    d1, _d2 = engine.enqueue(
        "q.dlq", [NewItem(b"D1", deadline=now - 50), NewItem(b"D2", deadline=now - 10)]
    )
    with ThreadPoolExecutor(1) as pool, gated_syncs() as gate:
        redriving = pool.submit(engine.redrive, "q.dlq", None, [d1.id])
        assert gate.wait_arrived(1), "the redrive never synced its copy"
        copy_path = gate.paths[0]
        during_copy = _taken(engine, "q.dlq")
        gate.let_one()
        assert gate.wait_arrived(2), "the redrive never synced its removal"
        removal_path = gate.paths[1]
        during_removal = _taken(engine, "q.dlq")
        gate.open()
        result = redriving.result(ANSWER_S)
    assert "/q/" in copy_path and "/q.dlq/" in removal_path, gate.paths
    assert during_copy == [], "the dead-letter queue handed out an item being redriven"
    assert during_removal == [], "the dead-letter queue handed out an item being removed"
    assert result.moved == 1 and result.to == ["q"] and not result.failed
    assert [v for v, _ in _taken(engine, "q.dlq")] == [b"D2"]
    assert [v for v, _ in _taken(engine, "q")] == [b"D1"]
