"""Names the engine keeps for itself, dead-letter names that never point back at their
own queue, and the bound on the number of queues."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine, NewItem, QueueConfig
from dq.storage.errors import InvalidQueueName, TooManyQueues
from dq.storage.types import check_queue_name
from tests.storage.conftest import FakeClock


@pytest.mark.parametrize("name", [".deleted-x", ".deleted-q-1763850000000000000", ".hidden"])
def test_engine_internal_names_are_refused(open_engine: Callable[..., Engine], name: str) -> None:
    with pytest.raises(InvalidQueueName):
        check_queue_name(name)
    e = open_engine()
    with pytest.raises(InvalidQueueName):
        e.enqueue(name, [NewItem(b"x")])
    with pytest.raises(InvalidQueueName):
        e.put_queue(name, QueueConfig())
    with pytest.raises(InvalidQueueName):
        e.put_queue("q", QueueConfig(max_deliveries=1, dead_letter_queue=name))
    assert e.list_queues() == []


def test_a_deleted_queue_leaves_nothing_that_reopens(
    open_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"x")])
    e.enqueue("keep", [NewItem(b"y")])
    e.delete_queue("q")
    e.close()
    e = open_engine(path=tmp_path / "data")
    assert e.list_queues() == ["keep"]
    assert [p.name for p in (tmp_path / "data" / "queues").iterdir()] == ["keep"]


def test_a_long_name_gets_a_dead_letter_queue_other_than_itself(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    for name in ("a" * 128, "b" * 124 + ".dlq", "c" * 125):
        e.put_queue(name, QueueConfig(default_lease_ms=100, max_deliveries=1))
        target = e.stats(name).dead_letter_queue
        assert target is not None and target != name and len(target) <= 128
        check_queue_name(target)
        e.enqueue(name, [NewItem(b"poison")])
        [_d] = e.dequeue(name)
        clock.advance(101)  # the lease runs out: a second delivery would pass the limit
        assert e.dequeue(name) == []
        [moved] = e.dequeue(target)
        assert moved.value == b"poison"
        assert e.stats(name).pending == 0


def test_the_number_of_queues_is_bounded(open_engine: Callable[..., Engine]) -> None:
    e = open_engine(max_queues=3)
    for name in ("a", "b", "c"):
        e.ensure_queue(name)
    assert all(e.has_queue(n) for n in ("a", "b", "c")) and not e.has_queue("d")
    with pytest.raises(TooManyQueues) as err:
        e.enqueue("d", [NewItem(b"x")])
    assert "at most 3 queues" in str(err.value)
    with pytest.raises(TooManyQueues):
        e.put_queue("d", QueueConfig())
    e.enqueue("a", [NewItem(b"x")])  # existing queues still take writes
    e.delete_queue("c")
    e.ensure_queue("d")
    assert e.list_queues() == ["a", "b", "d"]


def test_memseg_bytes_bounds_the_memory_of_small_values(
    open_engine: Callable[..., Engine],
) -> None:
    """Small values cost more in memory (``ENTRY_MEMORY``, 64 bytes an entry beyond the
    value) than in the log (~37): the log is frozen when either reaches ``memseg_bytes``."""
    limit = 64 * 1024
    e = open_engine(memseg_bytes=limit, max_frozen=2)
    for _ in range(80):
        e.enqueue("q", [NewItem(b"sixteen-bytes-ab") for _ in range(100)])
        stats = e.stats("q")
        assert stats.extra["memory_bytes"] <= 3 * limit + 100 * 300, stats.extra
    q = e.queue("q")
    assert q.commit.wal.size < limit * 3 // 4  # rotations came from memory, before the log filled
    assert len(q.segments) >= 5
    assert e.stats("q").pending == 8000
