"""Item groups in the engine (``docs/delivery.md``): each path that writes an entry
keeps its group — keyed and plain enqueues, freezing, merging files with and without
groups, a reopened log — and a bad group is refused before anything is written."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from dq.storage import Engine, NewItem, QueueConfig
from dq.storage.errors import InvalidGroup
from tests.storage.conftest import FakeClock


def drain(e: Engine, queue: str) -> dict[bytes, str | None]:
    got: dict[bytes, str | None] = {}
    while batch := e.dequeue(queue, 100, 60_000):
        got.update({d.value: d.group for d in batch})
    return got


def test_groups_through_freeze_merge_and_reopen(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"old-%d" % n) for n in range(3)])  # a file without groups
    e.freeze("q")
    e.enqueue("q", [NewItem(b"a", group="g1"), NewItem(b"b"), NewItem(b"c", group="g2")])
    e.freeze("q")
    keyed = [NewItem(b"k1", key="key-1", group="g3"), NewItem(b"k2", key="key-2")]
    e.enqueue("q", keyed)
    assert e.enqueue("q", keyed)[0].duplicate  # a repeat writes nothing, group or not
    q = e.queue("q")
    assert [r.has_groups for r in q.segments] == [False, True]
    q.merge(0, len(q.segments))
    assert [r.has_groups for r in q.segments] == [True]
    e.close()
    e = open_engine()
    want = {b"old-0": None, b"old-1": None, b"old-2": None, b"a": "g1", b"b": None}
    want |= {b"c": "g2", b"k1": "g3", b"k2": None}
    assert drain(e, "q") == want


def test_requeued_and_expired_items_keep_their_group_in_files(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"x", group="g")])
    (d,) = e.dequeue("q", 1, 1000)
    clock.advance(2000)
    e.queue("q").expire_leases()  # written back with a new entry: the group with it
    e.freeze("q")
    e.close()
    e = open_engine()
    (again,) = e.dequeue("q", 1, 1000)
    assert (again.id, again.group, again.stats.dequeue_count) == (d.id, "g", 2)


@pytest.mark.parametrize("bad", ["", "x" * 129, "new\nline", "ü", 5])
def test_bad_groups_are_refused_whole(open_engine: Callable[..., Engine], bad: object) -> None:
    e = open_engine()
    with pytest.raises(InvalidGroup) as refused:
        e.enqueue("q", [NewItem(b"fine"), NewItem(b"bad", group=bad)])  # type: ignore[arg-type]
    assert refused.value.context.get("index") == 1
    assert e.list_queues() == [] or e.queue("q").stats().pending == 0


def test_a_lease_of_an_item_read_from_a_file_shares_its_groups_name(
    open_engine: Callable[..., Engine],
) -> None:
    """A segment file's group column is read as a new string for each entry; a lease
    keeps the one string of its group's name that the delivery index holds, so a
    group's leases and held items cost its name once (``docs/delivery.md``: memory)."""
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=2))
    e.enqueue("q", [NewItem(b"%d" % n, group="tenant-" + "x" * 40) for n in range(3)])
    e.freeze("q")
    got = e.dequeue("q", 3, 60_000)
    assert len(got) == 2  # the third is held
    q = e.queue("q")
    (name,) = q.deliveries.index.group_names()
    assert q.deliveries.index.group_state(name) == (name, 2, 1, 0)  # 2 leased, 1 held
    leases = [q.deliveries.leases.get(d.id) for d in got]
    assert all(lease is not None and lease.group is name for lease in leases)
    assert all(d.group is name for d in got)
    e.enqueue("plain", [NewItem(b"%d" % n, group="tenant-" + "y" * 40) for n in range(2)])
    e.freeze("plain")  # no rule: dequeue's plain walk counts the leases all the same
    got = e.dequeue("plain", 2, 60_000)
    p = e.queue("plain")
    (name,) = p.deliveries.index.group_names()
    assert [p.deliveries.leases.get(d.id).group for d in got] == [name, name]
    assert all(p.deliveries.leases.get(d.id).group is name for d in got)


def test_an_item_written_again_from_a_file_keeps_its_groups_one_string(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """A group read from a segment file is a new string; an item written again from
    there — dead-lettered, redriven — keeps the one interned string of its group in
    memory, as an enqueued item does."""
    e = open_engine()
    e.put_queue("q", QueueConfig(max_deliveries=1, dead_letter_queue="dlq"))
    name = "-".join(["tenant", "z" * 30])  # made at run time, as a request's text is
    e.enqueue("q", [NewItem(b"x", group=name)])
    e.dequeue("q", 1, 1000)
    clock.advance(2000)
    e.queue("q").expire_leases()
    e.freeze("q")
    assert e.dequeue("q", 1, 1000) == []  # delivered once already: a dead letter
    (dead,) = e.queue("dlq").files.memseg.group_names
    assert dead == name and dead is sys.intern(name)
    e.freeze("dlq")
    assert e.redrive("dlq").moved == 1
    (back,) = e.queue("q").files.memseg.group_names
    assert back is sys.intern(name)
    assert [d.group for d in e.dequeue("q", 1, 1000)] == [name]


def test_thousands_of_groups_read_back_from_memory_and_from_the_frozen_file(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """Each of thousands of groups' items is delivered with its own group: read from the
    in-memory segment's names before its log is frozen, from the segment file's group
    column after, and from the log again after a restart."""
    e = open_engine()
    names = ["-".join(("tenant", str(n))) for n in range(3000)]
    want = {b"%d" % i: names[i * 7 % 3000] if i % 4 else None for i in range(9000)}
    items = [NewItem(v, group=g) for v, g in want.items()]
    for start in range(0, len(items), 500):
        e.enqueue("q", items[start : start + 500])
    mem = e.queue("q").files.memseg
    assert mem.grouped == sum(g is not None for g in want.values())
    assert sorted(mem.group_names) == sorted({g for g in want.values() if g is not None})
    got: dict[bytes, str | None] = {}
    while len(got) < 3000:
        got.update({d.value: d.group for d in e.dequeue("q", 100, 60_000)})
    e.close()
    e = open_engine()  # nothing leased after a restart: the log read again
    again: dict[bytes, str | None] = {}
    while len(again) < 3000:
        again.update({d.value: d.group for d in e.dequeue("q", 100, 60_000)})
    assert again == got
    e.freeze("q")
    got |= drain(e, "q")
    assert got == want
