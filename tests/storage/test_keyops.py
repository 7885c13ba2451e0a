"""Items addressed by key (storage/keyops.py, Queue.key_state and the replace of an
enqueue), through the engine: peek, cancel and reschedule or replace by key, the
rules for leased and gone items, and all of it after a restart, a freeze and a merge."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine, Fail, NewItem, QueueConfig, Release, RetryPolicy
from dq.storage.errors import InvalidArgument, ItemLeased, ItemNotFound, KeyNotFound
from tests.storage.conftest import FakeClock

Q = "payments"
Open = Callable[..., Engine]
MINUTE = 60_000


def _values(e: Engine, queue: str = Q) -> list[tuple[int, int, bytes | None]]:
    return [(i.id, i.deadline or 0, i.value) for i in e.browse(queue, "all", None, 100, True).items]


def test_peek_shows_the_item_a_key_names_wherever_it_is(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(dedup_window_ms=3600_000))  # keys outlive the 30 min delay
    [done] = e.enqueue(Q, [NewItem(b"timeout order 7", delay_ms=30 * MINUTE, key="order-7")])
    item = e.peek_key(Q, "order-7")
    assert (item.id, item.state, item.deadline, item.value) == (
        done.id,
        "delayed",
        done.deadline,
        b"timeout order 7",
    )
    clock.advance(30 * MINUTE)
    [d] = e.dequeue(Q, 1, 1000)
    assert e.peek_key(Q, "order-7").state == "leased"
    e.release(Q, [Release(d.id, d.receipt)])
    assert e.peek_key(Q, "order-7").state == "gone"
    with pytest.raises(KeyNotFound, match="key 'order-8' names no item"):
        e.peek_key(Q, "order-8")


def test_a_payment_timeout_cancelled_by_key_never_fires(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(dedup_window_ms=3600_000))
    e.enqueue(Q, [NewItem(b"timeout order 7", delay_ms=30 * MINUTE, key="order-7")])
    e.enqueue(Q, [NewItem(b"timeout order 8", delay_ms=30 * MINUTE, key="order-8")])
    clock.advance(10 * MINUTE)  # order 7 is paid
    cancelled = e.cancel_key(Q, "order-7")
    assert e.peek(Q, cancelled).state == "gone"
    with pytest.raises(KeyNotFound):
        e.cancel_key(Q, "order-7")  # the key is free again
    clock.advance(20 * MINUTE)
    assert [d.value for d in e.dequeue(Q, 10, 1000)] == [b"timeout order 8"]
    [again] = e.enqueue(Q, [NewItem(b"timeout order 7 (retry)", key="order-7")])
    assert not again.duplicate and again.id != cancelled


def test_a_leased_item_answers_item_leased_and_nothing_changes(open_engine: Open) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"v", key="k")])
    [d] = e.dequeue(Q, 1, 1000)
    with pytest.raises(ItemLeased, match="is leased"):
        e.cancel_key(Q, "k")
    with pytest.raises(ItemLeased):
        e.patch_key(Q, "k", delay_ms=5000)
    assert e.release(Q, [Release(d.id, d.receipt)])[0].ok  # the lease is as it was
    with pytest.raises(ItemNotFound, match="no longer in queue"):
        e.cancel_key(Q, "k")
    with pytest.raises(ItemNotFound):
        e.patch_key(Q, "k", value=b"w")


def test_patch_reschedules_or_replaces_a_pending_item(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(retry=RetryPolicy(delays_ms=(0,))))
    [first] = e.enqueue(Q, [NewItem(b"v1", key="k")])
    [d] = e.dequeue(Q, 1, 1000)
    e.fail(Q, [Fail(d.id, d.receipt, "nope")])
    moved = e.patch_key(Q, "k", delay_ms=5000)
    assert moved.id == first.id and moved.deadline == clock.now + 5000
    assert e.dequeue(Q, 1, 1000) == []
    same = e.patch_key(Q, "k", value=b"v2")  # the same deadline: it moves by 1 ms
    assert same.deadline == moved.deadline + 1
    with pytest.raises(InvalidArgument, match="nothing to change"):
        e.patch_key(Q, "k")
    clock.advance(5001)
    [d] = e.dequeue(Q, 1, 1000)
    assert (d.id, d.value, d.stats.dequeue_count, d.last_error) == (first.id, b"v2", 2, "nope")
    assert _values(e) == [(first.id, same.deadline, b"v2")]  # one item


def test_replace_debounces_to_one_item(open_engine: Open, clock: FakeClock) -> None:
    """ "Send the digest 5 minutes after the last change": every change replaces the
    pending digest, which is sent once."""
    e = open_engine()
    ids = set()
    for change in range(5):
        [done] = e.enqueue(
            Q,
            [
                NewItem(
                    b"digest %d" % change, delay_ms=5 * MINUTE, key="digest", on_duplicate="replace"
                )
            ],
        )
        ids.add(done.id)
        assert done.replaced == (change > 0)
        clock.advance(MINUTE)
    assert len(ids) == 1 and len(_values(e)) == 1
    clock.advance(3 * MINUTE)
    assert e.dequeue(Q, 10, 1000) == []  # 5 minutes after the last change, not the first
    clock.advance(MINUTE)
    [d] = e.dequeue(Q, 10, 1000)
    assert d.value == b"digest 4"
    e.release(Q, [Release(d.id, d.receipt)])
    [later] = e.enqueue(Q, [NewItem(b"digest 5", key="digest", on_duplicate="replace")])
    assert not later.replaced and later.id not in ids  # sent already: a new digest


def test_replacing_a_leased_item_enqueues_a_new_one_the_key_names(open_engine: Open) -> None:
    e = open_engine()
    [first] = e.enqueue(Q, [NewItem(b"a", key="k")])
    [d] = e.dequeue(Q, 1, 1000)
    [second] = e.enqueue(Q, [NewItem(b"b", key="k", on_duplicate="replace")])
    assert second.id != first.id and not second.duplicate and not second.replaced
    assert e.peek_key(Q, "k").id == second.id
    assert e.release(Q, [Release(d.id, d.receipt)])[0].ok  # the leased one goes its way
    [keep] = e.enqueue(Q, [NewItem(b"c", key="k")])  # "keep": a duplicate, as always
    assert keep.duplicate and keep.id == second.id


def test_a_batch_replacing_one_key_twice_keeps_the_last(open_engine: Open) -> None:
    e = open_engine()
    [old] = e.enqueue(Q, [NewItem(b"old", key="a")])
    out = e.enqueue(
        Q,
        [
            NewItem(b"a1", key="a", on_duplicate="replace"),
            NewItem(b"b1", key="b", on_duplicate="replace"),
            NewItem(b"a2", key="a", on_duplicate="replace"),
            NewItem(b"b2", key="b", on_duplicate="replace"),
            NewItem(b"b3", key="b"),
        ],
    )
    assert [(o.id, o.replaced, o.duplicate) for o in out] == [
        (old.id, True, False),
        (old.id + 1, False, False),
        (old.id, True, False),
        (old.id + 1, True, False),
        (old.id + 1, False, True),
    ]
    assert sorted(v for _i, _d, v in _values(e)) == [b"a2", b"b2"]


def test_keys_and_their_moves_survive_a_restart_a_freeze_and_a_merge(
    open_engine: Open, tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "data"
    e = open_engine(path=path)
    e.enqueue(Q, [NewItem(b"x%d" % i, delay_ms=MINUTE, key=f"k{i}") for i in range(6)])
    e.freeze(Q)
    e.patch_key(Q, "k1", delay_ms=2 * MINUTE)
    e.enqueue(Q, [NewItem(b"new", delay_ms=3 * MINUTE, key="k2", on_duplicate="replace")])
    e.cancel_key(Q, "k3")
    e.freeze(Q)
    q = e.queue(Q)
    q.merge(0, len(q.segments))
    e.close()
    e = open_engine(path=path)
    assert e.peek_key(Q, "k1").deadline == clock.now + 2 * MINUTE
    assert e.peek_key(Q, "k2").value == b"new"
    with pytest.raises(KeyNotFound):
        e.peek_key(Q, "k3")
    assert e.cancel_key(Q, "k4") == e.peek(Q, 5).id
    clock.advance(MINUTE)
    assert sorted(d.value for d in e.dequeue(Q, 10, 1000)) == [b"x0", b"x5"]


def test_a_key_past_its_window_names_nothing(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(dedup_window_ms=MINUTE))
    e.enqueue(Q, [NewItem(b"late", delay_ms=2 * MINUTE, key="k")])
    clock.advance(MINUTE + 1)
    with pytest.raises(KeyNotFound, match="in the last 60000 ms"):
        e.cancel_key(Q, "k")
    # a replace past the window is a new item: the old one is still there
    e.enqueue(Q, [NewItem(b"other", key="k", on_duplicate="replace")])
    assert len(_values(e)) == 2
    e.put_queue("nokeys", QueueConfig(dedup_window_ms=0))
    e.enqueue("nokeys", [NewItem(b"v", key="k")])
    with pytest.raises(KeyNotFound, match="keeps no keys"):
        e.peek_key("nokeys", "k")


def test_on_duplicate_takes_keep_or_replace(open_engine: Open) -> None:
    e = open_engine()
    with pytest.raises(InvalidArgument, match="on_duplicate must be 'keep' or 'replace'"):
        e.enqueue(Q, [NewItem(b"v", key="k", on_duplicate="merge")])  # type: ignore[arg-type]


def test_items_the_delivery_rules_hold_back_are_found_cancelled_and_moved_by_key(
    open_engine: Open, clock: FakeClock
) -> None:
    """With group_limit 1 the cursor passes a group's later items and holds them back:
    they are pending all the same, so a key finds, cancels and moves them (a moved one
    goes after the cursor, like a requeue: 1 ms after the key the cursor is at)."""
    e = open_engine()
    e.put_queue(Q, QueueConfig(group_limit=1))
    first, second, third = e.enqueue(
        Q, [NewItem(b"a%d" % n, key=f"a{n}", group="g") for n in (1, 2, 3)]
    )
    [d] = e.dequeue(Q, 10, 1000)  # a2 and a3 are held back behind the cursor
    assert d.id == first.id
    assert e.peek_key(Q, "a2").state == "due"
    assert e.cancel_key(Q, "a2") == second.id
    moved = e.patch_key(Q, "a3", value=b"a3 again")
    assert moved.id == third.id
    [again] = e.enqueue(Q, [NewItem(b"a3 last", key="a3", group="g", on_duplicate="replace")])
    assert again.replaced and again.id == third.id
    # past the cursor: 1 ms after it, and 1 ms more for the key its move just left
    assert (moved.deadline, again.deadline) == (third.deadline + 1, third.deadline + 2)
    e.release(Q, [Release(d.id, d.receipt)])
    clock.advance(2)
    [d] = e.dequeue(Q, 10, 1000)
    assert (d.id, d.value) == (third.id, b"a3 last")
    e.release(Q, [Release(d.id, d.receipt)])
    assert e.dequeue(Q, 10, 1000) == []
    assert e.stats(Q).pending == 0
