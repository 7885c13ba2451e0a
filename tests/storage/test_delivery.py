"""The delivery rules in the engine (``storage/_delivery.c``, ``docs/delivery.md``):
``group_limit`` (FIFO groups, an expired item back first), ``leased_limit``, ``fair``
and ``rate_limit``, and what reads behind the cursor — browse, peek, delete, purge,
redrive, stats — saying the same of the items the rules hold back, across freezes,
merges, pauses, config changes and reopening."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dq.storage import Engine, NewItem, RetryPolicy
from dq.storage._delivery import DeliveryIndex
from dq.storage.codec import encode_key
from dq.storage.errors import OutOfRange, StorageError
from dq.storage.types import Delivery, Fail, QueueConfig, RateLimit, Release, Requeue
from tests.storage.conftest import FakeClock

LEASE = 10_000


def put(e: Engine, *items: tuple[str, str | None]) -> None:
    e.enqueue("q", [NewItem(v.encode(), group=g) for v, g in items])


def take(e: Engine, n: int = 100, lease: int = LEASE) -> list[Delivery]:
    return e.dequeue("q", n, lease)


def values(ds: list[Delivery]) -> list[str]:
    return [d.value.decode() for d in ds]


def release(e: Engine, *ds: Delivery) -> None:
    outcomes = e.release("q", [Release(d.id, d.receipt) for d in ds])
    assert all(o.ok for o in outcomes), outcomes


def by_value(ds: list[Delivery], v: str) -> Delivery:
    return next(d for d in ds if d.value == v.encode())


# ------------------------------------------------------------------ group_limit


def test_group_limit_one_makes_each_group_fifo_and_holds_no_ungrouped_item(
    open_engine: Callable[..., Engine],
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("b1", "b"), ("n1", None), ("a3", "a"), ("n2", None))
    first = take(e)
    assert values(first) == ["a1", "b1", "n1", "n2"]
    assert take(e) == []  # a2 waits for a1, b has nothing more
    release(e, by_value(first, "a1"))
    second = take(e)
    assert values(second) == ["a2"]
    release(e, *second)
    assert values(take(e)) == ["a3"]


def test_group_limit_n_leases_at_most_n_of_a_group(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=5))
    put(e, *((f"t{i}", "tenant-a") for i in range(12)), ("b0", "tenant-b"))
    got = take(e)
    assert values(got) == ["t0", "t1", "t2", "t3", "t4", "b0"]
    release(e, got[1], got[3])
    assert values(take(e)) == ["t5", "t6"]
    assert take(e) == []


def test_an_expired_item_comes_back_ahead_of_its_groups_later_items(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("b1", "b"))
    assert values(take(e, lease=1000)) == ["a1", "b1"]  # a2 is held behind a1
    clock.advance(500)
    put(e, ("a3", "a"), ("c1", "c"))  # not read yet when a1's lease runs out
    clock.advance(1000)
    back = take(e, lease=1000)
    # a1 and b1 came back due now (after a3 and c1 by key), yet a1 goes before a2, a3
    assert values(back) == ["c1", "a1", "b1"]
    assert by_value(back, "a1").stats.dequeue_count == 2
    release(e, by_value(back, "a1"))
    assert values(take(e)) == ["a2"]


def test_an_expired_item_held_by_the_retry_policy_keeps_its_group_waiting(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """With a retry policy an expired item comes back later than now, and its ordered
    group hands out nothing else until it has (other groups go on meanwhile)."""
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1, retry=RetryPolicy(delays_ms=(2000,))))
    put(e, ("a1", "a"), ("a2", "a"), ("b1", "b"))
    assert values(take(e, lease=1000)) == ["a1", "b1"]
    clock.advance(1500)  # both leases ran out: due again 2 s later
    put(e, ("b2", "b"))
    assert take(e) == []  # a2 waits for a1; b1 and b2 wait for b1
    clock.advance(2000)
    back = take(e)
    assert values(back) == ["a1", "b1"]
    release(e, *back)
    assert values(take(e)) == ["a2", "b2"]


def test_a_group_whose_returning_item_was_deleted_goes_on(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"))
    (a1,) = take(e, lease=1000)
    clock.advance(1500)
    e.expire_leases("q")  # a1 is on its way back, ahead of a2
    e.delete_item("q", a1.id)  # ... and is deleted before dequeue reaches it
    assert values(take(e)) == ["a2"]


def test_a_mark_dropped_without_its_item_lets_its_group_go_on() -> None:
    """The delivery index's marks of items on their way back from an expired lease: one
    the cursor passes without its item (cancelled meanwhile), or one a rebuild from what
    is stored does not find, holds its group back no longer; a group with nothing else
    to remember is forgotten."""
    index = DeliveryIndex()
    index.configure(QueueConfig(group_limit=1), 0)
    index.returning({encode_key(5, 1): "a", encode_key(5, 2): "b"})
    index.hold("a", encode_key(1, 3), 0)  # a's next item waits behind a's mark
    assert index.next_held(0) is None
    assert index.passed(encode_key(5, 1), 0)  # the cursor passed a's mark, no a1 came
    assert index.next_held(0) == (encode_key(1, 3), "a")
    assert "b" in index.group_names()
    index.rebuilt_returning({}, 0)  # b's item is not among what is stored
    assert "b" not in index.group_names() and index.returning_count == 0


def test_a_requeued_item_keeps_its_group_order_by_its_new_deadline(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"))
    (a1,) = take(e)
    (o,) = e.requeue("q", [Requeue(a1.id, a1.receipt, delay_ms=5000)])
    assert o.ok
    (a2,) = take(e)
    assert a2.value == b"a2"  # a1 waits for its new deadline
    clock.advance(5000)
    assert take(e) == []  # a2 is leased: a1 waits for its slot
    assert e.stats("q").held == 1
    release(e, a2)
    assert values(take(e)) == ["a1"]


# ------------------------------------------------------------------ leased_limit


def test_leased_limit_caps_the_queue_and_every_end_of_a_lease_frees_a_slot(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(leased_limit=3))
    put(e, *((f"x{i}", "g" if i % 2 else None) for i in range(10)))
    got = take(e, lease=1000)
    assert values(got) == ["x0", "x1", "x2"]
    assert take(e) == []
    release(e, got[0])
    (x3,) = take(e, lease=1000)
    e.requeue("q", [Requeue(x3.id, x3.receipt, delay_ms=60_000)])
    e.delete_item("q", got[1].id)
    assert values(take(e, lease=1000)) == ["x4", "x5"]
    clock.advance(1000)  # every lease runs out
    assert len(take(e)) == 3
    assert e.stats("q").leased == 3


# ------------------------------------------------------------------ fair


def test_fair_serves_the_groups_with_due_items_in_turn(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(fair=True))
    put(e, *((f"a{i}", "tenant-a") for i in range(200)))
    clock.advance(1)
    put(e, ("b0", "tenant-b"), ("b1", "tenant-b"), ("n0", None))
    got: list[str] = []
    for _ in range(6):
        got += values(take(e, 1))
    # without fair b0 would wait for all 200 of tenant-a's items
    assert got == ["a0", "b0", "n0", "a1", "b1", "a2"]


def test_fair_with_a_group_limit_skips_full_groups(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(fair=True, group_limit=1))
    put(e, ("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b"), ("c0", "c"))
    got = take(e)
    assert values(got) == ["a0", "b0", "c0"]
    release(e, got[1])
    assert values(take(e)) == ["b1"]


def test_fair_turns_survive_a_change_of_config(open_engine: Callable[..., Engine]) -> None:
    """A group waiting for its turn keeps its place when the config changes: the group
    just served does not go again before it (a restart starts the turns afresh)."""
    e = open_engine()
    e.put_queue("q", QueueConfig(fair=True))
    put(e, ("a0", "a"), ("a1", "a"), ("b0", "b"), ("b1", "b"))
    assert values(take(e, 1)) == ["a0"]  # a served: b's turn next
    e.put_queue("q", QueueConfig(fair=True, default_lease_ms=5000))
    assert values(take(e, 1)) == ["b0"]
    e.put_queue("q", QueueConfig(fair=True, leased_limit=10))
    assert values(take(e)) == ["a1", "b1"]


# ------------------------------------------------------------------ rate_limit


def test_rate_limit_is_a_token_bucket_over_deliveries(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(rate_limit=RateLimit(per_second=50, burst=5)))
    put(e, *((f"m{i}", None) for i in range(20)))
    assert len(take(e)) == 5  # the burst
    assert take(e) == []  # over the limit: the items stay due
    s = e.stats("q")  # each dequeue the limit cut short is counted
    assert (s.due, s.held, s.rate_limited) == (15, 15, 2)
    assert e.next_wakeup("q") == clock.now + 20  # the next token, 1/50 s on
    clock.advance(20)
    assert len(take(e)) == 1
    clock.advance(1000)  # a second refills the bucket up to its burst, no more
    assert len(take(e)) == 5


def test_a_rate_limit_per_group_gives_each_group_its_own_bucket(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(rate_limit=RateLimit(per_second=10, burst=2, per_group=True)))
    put(e, *((f"a{i}", "a") for i in range(5)), *((f"b{i}", "b") for i in range(5)))
    put(e, ("n0", None), ("n1", None), ("n2", None))
    assert values(take(e)) == ["a0", "a1", "b0", "b1", "n0", "n1"]
    assert e.stats("q").held == 7
    assert e.next_wakeup("q") == clock.now + 100
    clock.advance(100)
    assert values(take(e)) == ["a2", "b2", "n2"]  # one token each, oldest first


# ------------------------------------------------------------------ what reads behind the cursor


def test_browse_peek_and_stats_show_held_items_as_due(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a"))
    got = take(e)
    assert values(got) == ["a1", "b1"]
    page = e.browse("q", limit=2)
    assert [(i.id, i.state, i.group) for i in page.items] == [(1, "leased", "a"), (2, "due", "a")]
    assert page.next is not None
    rest = e.browse("q", after=page.next)
    assert [(i.id, i.state) for i in rest.items] == [(3, "leased"), (4, "due")]
    assert [i.id for i in e.browse("q", state="due").items] == [2, 4]
    assert e.peek("q", 4).state == "due" and e.peek("q", 4).group == "a"
    s = e.stats("q")
    assert (s.pending, s.due, s.leased, s.held, s.groups) == (4, 2, 2, 2, 2)
    assert [(g.group, g.leased, g.waiting, g.held) for g in e.groups("q", 10)] == [
        ("a", 1, 2, 2),
        ("b", 1, 0, 0),
    ]


def test_browse_page_by_page_shows_every_held_item(open_engine: Callable[..., Engine]) -> None:
    """More held items than a page holds, and nothing after the cursor: each page ends
    where it stopped, and the next goes on from there."""
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("a3", "a"), ("a4", "a"))
    assert values(take(e)) == ["a1"]
    for limit in (1, 2, 3):
        seen, after = [], None
        for _ in range(10):
            page = e.browse("q", after=after, limit=limit)
            assert len(page.items) <= limit
            seen += [(i.id, i.state) for i in page.items]
            if page.next is None:
                break
            after = page.next
        assert seen == [(1, "leased"), (2, "due"), (3, "due"), (4, "due")], limit


def test_a_held_item_keeps_its_reasons_through_upkeep(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """An item held back behind the cursor is waiting, not gone: the upkeep that
    forgets the reasons of released items leaves its reasons be."""
    e = open_engine()
    e.put_queue("q", QueueConfig(fair=True))
    put(e, ("x", "a"), ("w", "b"))
    [x] = take(e, 1)
    assert e.fail("q", [Fail(x.id, x.receipt, "boom")])[0].ok  # due again at once
    clock.advance(1)  # (1 ms after the cursor)
    assert values(take(e, 1)) == ["w"]  # b's turn; x is read ahead and held
    q = e.queue("q")
    assert e.stats("q").held == 0 and q.deliveries.index.indexed == 1
    for _ in range(3):
        e.forget_gone_reasons(q)
    assert [r.error for r in e.peek("q", x.id).errors or ()] == ["boom"]
    [again] = take(e, 1)
    assert (again.id, again.last_error) == (x.id, "boom")


def test_delete_and_purge_remove_held_items(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("a3", "a"), ("a4", "a"))
    (a1,) = take(e)
    e.delete_item("q", 2)
    assert e.peek("q", 2).state == "gone"
    release(e, a1)
    assert values(take(e)) == ["a3"]
    assert e.purge("q") == 2  # a3 (leased) and a4 (held)
    assert e.stats("q").pending == 0 and take(e) == []
    put(e, ("a5", "a"))
    assert values(take(e)) == ["a5"]  # the group's slot was freed by the purge


def test_held_items_are_read_from_segment_files_after_freeze_and_merge(
    open_engine: Callable[..., Engine],
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, *((f"a{i}", "a") for i in range(3)))
    e.freeze("q")
    put(e, *((f"b{i}", "b") for i in range(3)))
    (a0, b0) = take(e)
    e.freeze("q")
    q = e.queue("q")
    q.merge(0, len(q.segments))
    release(e, a0, b0)
    got = take(e)
    assert values(got) == ["a1", "b1"]
    release(e, *got)
    assert values(take(e)) == ["a2", "b2"]


def test_nothing_is_leased_or_held_after_a_reopen(
    open_engine: Callable[..., Engine], tmp_path: object
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1, leased_limit=2))
    put(e, ("a1", "a"), ("a2", "a"), ("b1", "b"))
    assert values(take(e)) == ["a1", "b1"]
    e.close()
    e = open_engine()
    assert e.get_queue("q").group_limit == 1  # durable, in queue.json
    assert values(take(e)) == ["a1", "b1"]  # a restart ends every lease


def test_pause_holds_everything_and_resume_goes_on(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"))
    (a1,) = take(e)
    e.pause("q")
    release(e, a1)
    assert take(e) == []
    e.resume("q")
    assert values(take(e)) == ["a2"]


def test_dropping_the_rules_hands_out_what_they_held(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1))
    put(e, ("a1", "a"), ("a2", "a"), ("a3", "a"))
    take(e)
    e.put_queue("q", QueueConfig())
    assert values(take(e)) == ["a2", "a3"]
    e.put_queue("q", QueueConfig(group_limit=2))  # three leased: over the new limit
    put(e, ("a4", "a"))
    assert take(e) == []


def test_dead_letters_go_in_their_groups_turn(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1, max_deliveries=1))
    put(e, ("a1", "a"), ("a2", "a"))
    (a1,) = take(e)
    e.requeue("q", [Requeue(a1.id, a1.receipt)])  # delivered once: next time it dies
    (a2,) = take(e)
    assert a2.value == b"a2" and e.stats("q").dead_lettered == 0  # a1 is after a2 now
    release(e, a2)
    clock.advance(1)  # a1 went back after the cursor, which had passed a2
    assert take(e) == []
    assert e.stats("q").dead_lettered == 1
    assert values(e.dequeue("q.dlq", 10, LEASE)) == ["a1"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (QueueConfig(group_limit=0), "group_limit must be between 1 and 4294967295"),
        (QueueConfig(leased_limit=-1), "leased_limit must be between 1 and 4294967295"),
        (
            QueueConfig(rate_limit=RateLimit(per_second=0, burst=1)),
            "per_second must be a number above 0 and at most 1000000",
        ),
        (QueueConfig(rate_limit=RateLimit(per_second=1, burst=0)), "burst must be between 1"),
        (QueueConfig(fair="yes"), "fair must be true or false"),  # type: ignore[arg-type]
    ],
)
def test_rules_out_of_range_are_refused_and_change_nothing(
    open_engine: Callable[..., Engine], config: QueueConfig, message: str
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=3))
    with pytest.raises(StorageError) as refused:
        e.put_queue("q", config)
    assert isinstance(refused.value, OutOfRange) or refused.value.code == "validation_error"
    assert message in refused.value.message
    assert e.get_queue("q").group_limit == 3
