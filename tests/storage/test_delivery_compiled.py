"""The compiled delivery index (``storage/_delivery.c``) driven directly: a Hypothesis
state machine against the plainest model of its rules (a FIFO of keys per group, its
leases, its items back from an expired lease; ``group_limit`` and ``fair``), the token
buckets of ``rate_limit`` against their promise, hostile use (keys of other lengths,
groups that are not str, clocks out of range, rows ``put_back`` cannot take), and its
memory: ``allocated`` is what it holds, a group's records go when it is idle, and the
names it keeps are let go."""

from __future__ import annotations

import gc
import random
import sys
import tracemalloc
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dq.storage._delivery import FRONT, HELD, MAX_HELD, RETURNING, DeliveryIndex
from dq.storage.codec import encode_key
from dq.storage.types import QueueConfig, RateLimit
from tests.storage.rules_model import Turns

T0 = 1_800_000_000_000
GROUPS = [None, "a", "b", "customer-42", "g" * 128]


def k(n: int) -> bytes:
    return encode_key(1000 + n, n)


@dataclass
class FakeLease:
    """What ``ended`` reads of a lease: its group."""

    group: str | None


def index_with(**rules: object) -> DeliveryIndex:
    index = DeliveryIndex()
    index.configure(QueueConfig(**rules), T0)  # type: ignore[arg-type]
    return index


def drain(index: DeliveryIndex, now: int = T0) -> list[bytes]:
    """Every held item that may go, handed out without a lease (set apart)."""
    out = []
    while (held := index.next_held(now)) is not None:
        out.append(held[0])
        index.done_with(held[1], now)
    return out


# ------------------------------------------------------------------ a group's held keys


def test_held_keys_go_out_in_the_order_they_were_held_and_their_memory_goes() -> None:
    index = index_with(group_limit=1)
    for n in range(1, 2000):
        index.hold("a", k(n), T0)
    full = index.allocated
    assert index.indexed == 1999 and index.group_state("a") == ("a", 0, 1999, 0)
    out = []
    for _ in range(1900):
        held = index.next_held(T0)
        assert held is not None
        out.append(held[0])
        index.done_with(held[1], T0)
    assert out == [k(n) for n in range(1, 1901)]
    # the buffer shrinks as the FIFO empties (halved once a quarter is used)
    assert index.allocated < full // 4
    assert index.oldest_key() == k(1901) and index.indexed == 99
    assert drain(index) == [k(n) for n in range(1901, 2000)]
    assert index.group_count == 0 and index.indexed == 0


def test_an_item_back_from_a_lease_goes_first_once_it_arrives() -> None:
    index = index_with(group_limit=1)
    index.hold("a", k(2), T0)
    index.returning({k(9): "a"})
    assert index.is_returning(k(9)) and index.returning_count == 1
    assert index.next_held(T0) is None  # the group waits for it
    assert not index.admits("a", T0)
    index.arrive(k(9), T0)
    assert not index.is_returning(k(9)) and index.oldest_key() == k(2)
    assert drain(index) == [k(9), k(2)]
    assert index.group_count == 0


def test_items_back_from_a_lease_go_in_key_order_however_they_arrive() -> None:
    """A mark put back after a refused removal may reach the cursor after a later item
    of its group did: it still goes first, and is the oldest held."""
    index = index_with(group_limit=1)
    index.returning({k(10): "a"})
    removed = index.remove([(k(10), "a")], T0)
    index.returning({k(20): "a"})
    index.arrive(k(20), T0)
    index.put_back(removed, T0)
    index.arrive(k(10), T0)
    assert index.oldest_key() == k(10)
    assert drain(index) == [k(10), k(20)]


def test_an_item_back_from_a_lease_is_the_oldest_held_after_a_removal_put_back() -> None:
    """The state machine's example: a mark removed and put back, then reached by the
    cursor after a later mark of its group had arrived: it is the oldest held key and
    goes before that later one (it used to sit behind it, missed by ``oldest_key``)."""
    index = DeliveryIndex()
    index.hold(None, k(1), T0)
    index.took(None, T0)
    index.returning({k(2): "customer-42"})
    index.hold(None, k(3), T0)
    removed = index.remove([(k(2), None), (k(4), "a")], T0)
    assert removed == [(k(2), "customer-42", RETURNING)]
    index.returning({k(5): "customer-42"})
    index.arrive(k(5), T0)
    index.put_back(removed, T0)
    assert not index.admits(None, T0)  # its held items go first
    index.arrive(k(2), T0)
    assert index.next_held(T0) == (k(1), None)
    index.done_with(None, T0)
    assert index.oldest_key() == k(2)
    assert index.held_after(b"", 10) == [(k(2), "customer-42"), (k(3), None), (k(5), "customer-42")]
    assert drain(index) == [k(2), k(3), k(5)]


def test_a_removal_put_back_leaves_the_fair_turns_as_they_were() -> None:
    """The state machine's example: with ``fair`` turned on after items were held, the
    items of two groups removed and put back (a refused delete): the group whose turn
    was next is still next, the one just served is not served again before it."""
    index = DeliveryIndex()
    for n, name in enumerate([None, None, None, "a"], 1):
        index.hold(name, k(n), T0)
    assert index.next_held(T0) == (k(1), None)
    index.done_with(None, T0)
    index.configure(QueueConfig(fair=True), T0)
    assert index.next_held(T0) == (k(2), None)  # a's turn is next
    index.done_with(None, T0)
    removed = index.remove([(k(3), None), (k(4), "a"), (k(5), "a")], T0)
    assert removed == [(k(3), None, HELD), (k(4), "a", HELD)]
    assert index.group_count == 0
    index.put_back(removed, T0)
    assert drain(index) == [k(4), k(3)]


def test_a_dequeue_between_a_removal_and_its_put_back_lets_the_places_go() -> None:
    """The state machine's example: a removal empties every group, a dequeue finds
    nothing to hand out (each group has left the line), then the removal is put back:
    the groups join the line again in the order they come back, as groups that may
    deliver again do, not in their old places (the ring passed them)."""
    index = DeliveryIndex()
    index.returning({k(1): "a"})
    index.hold(None, k(2), T0)
    index.configure(QueueConfig(fair=True), T0)
    index.arrive(k(1), T0)
    index.hold(None, k(3), T0)
    index.hold(None, k(4), T0)
    assert index.next_held(T0) == (k(2), None)  # a's turn is next
    index.done_with(None, T0)
    removed = index.remove([(k(3), None), (k(4), None), (k(1), "a")], T0)
    assert index.next_held(T0) is None
    index.put_back(removed, T0)
    assert drain(index) == [k(3), k(1), k(4)]


def test_a_group_put_back_takes_its_place_not_the_one_it_took_meanwhile() -> None:
    """A group emptied by a removal and given a new item before the removal is put back
    has joined the line at the back; the put back gives it its place again, once."""
    index = index_with(fair=True)
    for n, name in enumerate(["a", "b", "c"], 1):
        index.hold(name, k(n), T0)
    removed = index.remove([(k(1), "a")], T0)
    index.hold("a", k(9), T0)  # joins at the back: b, c, a
    index.put_back(removed, T0)  # back in its place: a, b, c
    assert drain(index) == [k(1), k(2), k(3), k(9)]


def test_removal_and_put_back_keep_key_order() -> None:
    index = index_with(group_limit=1)
    index.took(None, T0)  # a lease of no group: None is a group of its own, never held back
    for n in (1, 3, 5, 7):
        index.hold("a", k(n), T0)
    index.returning({k(20): "a", k(30): "a"})
    index.arrive(k(20), T0)
    assert index.holds(k(5), "a") and index.holds(k(20), "a") and not index.holds(k(4), "a")
    removed = index.remove([(k(5), "a"), (k(20), "a"), (k(4), "a"), (k(30), "b")], T0)
    assert removed == [(k(5), "a", HELD), (k(20), "a", FRONT), (k(30), "a", RETURNING)]
    assert index.held_after(b"", 10) == [(k(1), "a"), (k(3), "a"), (k(7), "a")]
    assert index.returning_count == 0 and index.indexed == 3
    index.put_back(removed, T0)
    assert index.held_after(k(1), 10) == [(k(3), "a"), (k(5), "a"), (k(7), "a"), (k(20), "a")]
    assert index.held_after(k(1), 2) == [(k(3), "a"), (k(5), "a")]
    assert index.returning_count == 1 and index.is_returning(k(30))
    assert index.passed(k(30), T0)  # its item did not come: the group goes on
    assert drain(index) == [k(20), k(1), k(3), k(5), k(7)]


def test_the_slots_of_a_group_and_of_the_queue() -> None:
    index = index_with(group_limit=2, leased_limit=3)
    assert index.took("a", T0) == "a" and index.took("a", T0) == "a"
    assert not index.admits("a", T0) and index.admits("b", T0) and index.admits(None, T0)
    index.hold("a", k(1), T0)
    assert index.next_held(T0) is None and index.held_back(T0) == 1
    assert index.queue_open(T0) and not index.at_leased_limit()
    index.took("b", T0)
    assert not index.queue_open(T0) and index.at_leased_limit()
    assert index.busiest(10, T0) == [("a", 2, 1, 1), ("b", 1, 0, 0)]
    assert index.ended([(1, FakeLease("a"))], T0)  # a slot freed: a's held item may go
    assert index.has_eligible(T0) and index.held_back(T0) == 0
    assert index.next_held(T0) == (k(1), "a")
    index.took("a", T0)
    index.done_with("a", T0)
    index.ended([(2, FakeLease("a")), (3, FakeLease("a")), (4, FakeLease("b"))], T0)
    assert index.taken == 0 and index.group_count == 0 and index.active  # rules set


def test_fair_groups_take_turns_and_a_freed_slot_gives_no_second_place() -> None:
    """With ``fair`` the groups with a held item that may go are served in turn; a slot
    of a group freed while it waits for its turn leaves it where it waits."""
    index = index_with(fair=True)
    index.took("x", T0)
    for n, name in enumerate(["x", "y", "x", "y", "x"], 1):
        index.hold(name, k(n), T0)
    index.ended([(0, FakeLease("x"))], T0)  # x waits for its turn already
    assert drain(index) == [k(1), k(2), k(3), k(4), k(5)]
    # a change of config is no turn of theirs: the groups keep their places
    for n, name in enumerate(["y", "x", "y", "x"], 6):
        index.hold(name, k(n), T0)
    index.configure(QueueConfig(fair=True, leased_limit=10), T0)
    assert drain(index) == [k(6), k(7), k(8), k(9)]


def test_a_group_costs_its_record_and_a_slot_of_the_name_table() -> None:
    """One lease and one held item a group (what ``bench/groups.py`` measures): the
    index's own bytes per group, all of them seen by tracemalloc."""
    names = [f"tenant-{n}" for n in range(20_000)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    index = index_with(group_limit=1)
    for n, name in enumerate(names):
        index.took(name, T0)
        index.hold(name, k(n), T0)
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    per_group = index.allocated / len(names)
    assert index.group_count == len(names) and index.indexed == len(names)
    # a 56-byte record (its one key inside) in an array grown by doubling, and a slot of
    # the name table (at most three quarters full)
    assert per_group <= 2 * 56 + 16, per_group
    assert traced - 4096 <= index.allocated <= traced
    assert sys.getsizeof(index) >= index.allocated
    index.ended([(n, FakeLease(name)) for n, name in enumerate(names)], T0)
    drain(index)
    assert index.group_count == 0


def test_the_index_holds_each_name_once_and_lets_go_of_it() -> None:
    names = [f"group-{n}" * 3 for n in range(50)]
    counts = [sys.getrefcount(g) for g in names]
    index = index_with(group_limit=1, rate_limit=RateLimit(10, 1, per_group=True))

    def fill(index: DeliveryIndex) -> None:
        for n, g in enumerate(names):
            assert index.took(g, T0) is g
            assert index.took("".join(list(g)), T0) is g  # an equal string: the index's own
            index.hold(g, k(n), T0)

    fill(index)
    # the group's record and its bucket each hold it once
    assert [sys.getrefcount(g) for g in names] == [c + 2 for c in counts]
    index.reset()  # slots, held items and buckets are forgotten
    assert [sys.getrefcount(g) for g in names] == counts
    assert index.group_count == 0 and index.buckets_kept == 0 and index.allocated == 0
    fill(index)
    del index
    gc.collect()
    assert [sys.getrefcount(g) for g in names] == counts


# ------------------------------------------------------------------ rate limits


def test_a_bucket_never_gives_more_than_its_burst_and_rate_allow() -> None:
    rng = random.Random(7)
    rate = RateLimit(per_second=37.5, burst=4)
    index = index_with(rate_limit=rate)
    now, given = T0, []
    for _ in range(5000):
        now += rng.choice((0, 0, 1, 3, 10, 40))
        if index.queue_open(now):
            index.took(None, now)
            given.append(now)
        else:
            assert index.queue_token_at(now) > now  # type: ignore[operator]
    for i, start in enumerate(given):  # over every span, from every token given
        for j in range(i, min(i + 60, len(given))):
            span = given[j] - start
            assert j - i + 1 <= rate.burst + rate.per_second * span / 1000 + 1e-9
    assert len(given) > 100


def test_the_next_token_is_when_a_whole_token_is_back() -> None:
    index = index_with(rate_limit=RateLimit(per_second=50, burst=1))
    index.took(None, T0)
    assert index.queue_token_at(T0) == T0 + 20
    assert not index.queue_open(T0 + 19)
    assert index.queue_token_at(T0 + 19) == T0 + 20
    assert index.queue_open(T0 + 20) and index.queue_token_at(T0 + 20) is None


def test_per_group_buckets_are_apart_and_full_ones_are_forgotten() -> None:
    index = index_with(rate_limit=RateLimit(per_second=1, burst=1, per_group=True))
    index.took("a", T0)
    assert not index.admits("a", T0) and index.admits("b", T0) and index.admits(None, T0)
    assert index.rate_refused == 1
    index.hold("a", k(1), T0)  # only its bucket stops it: it waits for its next token
    assert index.next_timer() == T0 + 1000 and index.held_back(T0) == 1
    index.tick(T0 + 999)
    assert index.next_held(T0 + 999) is None
    index.tick(T0 + 1000)  # its token came: it may deliver again
    assert index.next_held(T0 + 1000) == (k(1), "a")
    for n in range(3000):
        index.took(f"g{n}", T0 + 2000 + n)
    assert index.buckets_kept < 3000  # the early ones filled up again and were swept
    assert index.admits("a", T0 + 2000)


# ------------------------------------------------------------------ hostile use


def test_bad_arguments_are_refused_and_change_nothing() -> None:
    index = index_with(group_limit=1)
    index.hold("a", k(1), T0)
    state = (index.indexed, index.held_after(b"", 10), index.group_names(), index.allocated)
    bad = [
        lambda: index.hold("a", b"short", T0),
        lambda: index.hold("a", k(2) + b"x", T0),
        lambda: index.hold(7, k(2), T0),  # type: ignore[arg-type]
        lambda: index.hold(b"a", k(2), T0),  # type: ignore[arg-type]
        lambda: index.hold(type("S", (str,), {})("a"), k(2), T0),
        lambda: index.hold("a", k(2), 2**70),
        lambda: index.hold("a", k(2), "now"),  # type: ignore[arg-type]
        lambda: index.hold("a", k(2)),  # type: ignore[call-arg]
        lambda: index.took(1.5, T0),  # type: ignore[arg-type]
        lambda: index.admits([], T0),  # type: ignore[arg-type]
        lambda: index.hold_run((k(2),), None, 0, 1, T0),  # type: ignore[arg-type]
        lambda: index.hold_run([k(2)], None, 0, 2, T0),
        lambda: index.hold_run([k(2)], None, -1, 1, T0),
        lambda: index.hold_run([k(2)], ["a"], 1, 0, T0),
        lambda: index.remove([(k(1), "a", 1)], T0),  # type: ignore[list-item]
        lambda: index.remove([(k(1), "a"), (b"", "a")], T0),  # checked whole first
        lambda: index.put_back([(k(3), "a", 9)], T0),
        lambda: index.put_back([(k(3), "a")], T0),  # type: ignore[list-item]
        lambda: index.returning([(k(3), "a")]),  # type: ignore[arg-type]
        lambda: index.returning({b"x": "a"}),
        lambda: index.arrive(k(3), T0),
        lambda: index.ended([FakeLease("a")], T0),  # type: ignore[list-item]
        lambda: index.ended([(1, object())], T0),  # type: ignore[list-item]
        lambda: index.held_after(b"", -1),
        lambda: index.configure(QueueConfig(group_limit=0), T0),
        lambda: index.configure(QueueConfig(rate_limit=RateLimit(0, 1)), T0),
        lambda: index.configure(object(), T0),  # type: ignore[arg-type]
        lambda: setattr(index, "rate_refused", -1),
        lambda: setattr(index, "indexed", 0),
        lambda: DeliveryIndex(1),  # type: ignore[call-arg]
    ]
    for call in bad:
        with pytest.raises(
            (TypeError, ValueError, OverflowError, IndexError, KeyError, AttributeError)
        ):
            call()
        assert (
            index.indexed,
            index.held_after(b"", 10),
            index.group_names(),
            index.allocated,
        ) == state
    assert index.group_limit == 1 and index.leased_limit is None and not index.fair


#: anything a caller might pass where a key, a group, a clock or a count goes
anything = st.one_of(
    st.binary(max_size=20),
    st.builds(k, st.integers(0, 30)),
    st.sampled_from(GROUPS),
    st.text(max_size=5),
    st.integers(-(2**70), 2**70),
    st.sampled_from([T0, 0, -1, 2**63 - 1, 1.5, None, [], (), {}, object()]),
    st.lists(st.sampled_from([k(1), k(2), b"", "a", None, 7]), max_size=3),
    st.dictionaries(st.sampled_from([k(3), k(4), b"x", "a"]), st.sampled_from(GROUPS)),
    st.lists(st.tuples(st.builds(k, st.integers(0, 5)), st.sampled_from(GROUPS)), max_size=3),
    st.lists(
        st.tuples(st.builds(k, st.integers(0, 5)), st.sampled_from(GROUPS), st.integers(0, 4)),
        max_size=3,
    ),
)
#: what each argument of a method is meant to be
VALID = {
    "group": st.sampled_from(GROUPS),
    "key": st.builds(k, st.integers(0, 30)),
    "now": st.integers(T0, T0 + 5000),
    "n": st.integers(0, 7),
    "after": st.one_of(st.just(b""), st.builds(k, st.integers(0, 30))),
    "keys": st.lists(st.builds(k, st.integers(0, 30)), min_size=6, max_size=6),
    "groups": st.one_of(st.none(), st.lists(st.sampled_from(GROUPS), min_size=6, max_size=6)),
    "leases": st.lists(
        st.tuples(st.integers(0, 9), st.builds(FakeLease, st.sampled_from(GROUPS))), max_size=3
    ),
    "marks": st.dictionaries(st.builds(k, st.integers(0, 30)), st.sampled_from(GROUPS[1:])),
    "pairs": st.lists(st.tuples(st.builds(k, st.integers(0, 30)), st.sampled_from(GROUPS))),
    "rows": st.lists(
        st.tuples(st.builds(k, st.integers(0, 30)), st.sampled_from(GROUPS), st.integers(0, 4)),
        max_size=3,
    ),
}
METHODS = [
    ("took", "group now"), ("ended", "leases now"), ("queue_open", "now"),
    ("admits", "group now"), ("hold", "group key now"), ("hold", "group key now"),
    ("hold_run", "keys groups n n now"), ("returning", "marks"),
    ("rebuilt_returning", "marks now"), ("is_returning", "key"), ("arrive", "key now"),
    ("passed", "after now"), ("tick", "now"), ("next_held", "now"), ("next_held", "now"),
    ("done_with", "group now"), ("has_eligible", "now"), ("queue_token_at", "now"),
    ("holds", "key group"), ("remove", "pairs now"), ("put_back", "rows now"),
    ("held_after", "after n"), ("held_back", "now"), ("busiest", "n now"),
    ("group_state", "group"),
]  # fmt: skip


@st.composite
def call(draw: st.DrawFn) -> tuple[str, list[object]]:
    """A method and its arguments: each the kind it is meant to be, or now and then
    anything at all (or one argument too few)."""
    name, kinds = draw(st.sampled_from(METHODS))
    args = [draw(VALID[kind] if draw(st.integers(0, 4)) else anything) for kind in kinds.split()]
    if args and draw(st.integers(0, 19)) == 0:
        args.pop()
    return name, args


@settings(max_examples=400, deadline=None)
@given(
    st.lists(call(), max_size=60),
    st.sampled_from(
        [
            QueueConfig(group_limit=1),
            QueueConfig(group_limit=2, fair=True),
            QueueConfig(leased_limit=2, rate_limit=RateLimit(1000, 2, per_group=True)),
            QueueConfig(rate_limit=RateLimit(0.5, 1)),
        ]
    ),
)
def test_any_call_with_any_arguments_raises_or_keeps_the_index_whole(
    calls: list[tuple[str, list[object]]], config: QueueConfig
) -> None:
    """Hostile use, fuzzed: any method with any arguments either works or raises one of
    the errors bad input gets, and the index stays consistent (what it holds adds up to
    its counts, its groups are found by name, and it lets go of all it holds)."""
    index = DeliveryIndex()
    index.configure(config, T0)
    for name, args in calls:
        try:
            getattr(index, name)(*args)
        except (TypeError, ValueError, OverflowError, IndexError, KeyError):
            pass
        # (keys held out of order, or in two groups, break what callers promise: the
        # index need not answer for them, only stay whole)
        held = [key for key, _group in index.held_after(b"", 10**6)]
        assert index.indexed == len(held)
        assert sorted(held) == held
        names = index.group_names()
        assert len(names) == index.group_count
        assert sum(index.group_state(g)[2] for g in names) == index.indexed  # type: ignore[index]
    index.reset()
    assert index.allocated == 0 and index.group_count == 0


def test_hold_run_stops_at_the_first_item_that_may_go() -> None:
    index = index_with(group_limit=1)
    index.took("a", T0)
    keys = [k(n) for n in range(6)]
    groups: list[str | None] = ["a", "a", "b", "a", None, "a"]
    assert index.hold_run(keys, groups, 0, 6, T0) == 2  # b may go
    assert index.hold_run(keys, groups, 3, 6, T0) == 4  # no group: never held back
    assert index.hold_run(keys, None, 4, 6, T0) == 4
    assert index.held_after(b"", 10) == [(k(0), "a"), (k(1), "a"), (k(3), "a")]


def test_the_index_reads_no_further_once_it_holds_its_most() -> None:
    index = index_with(group_limit=1)
    index.took("a", T0)
    keys = [encode_key(1, n) for n in range(MAX_HELD + 10)]
    assert index.hold_run(keys, None, 0, len(keys), T0) == 0  # no group: may go
    assert index.hold_run(keys, ["a"] * len(keys), 0, len(keys), T0) == MAX_HELD
    assert index.full and index.indexed == MAX_HELD
    index.reset()
    assert index.indexed == 0 and index.group_count == 0 and not index.full


# ------------------------------------------------------------------ against a model


class ModelGroup:
    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.front: list[bytes] = []
        self.coming = 0
        self.leased = 0

    @property
    def idle(self) -> bool:
        return not (self.keys or self.front or self.coming or self.leased)

    @property
    def head(self) -> bytes | None:
        if self.front or self.coming:
            return self.front[0] if self.front else None
        return self.keys[0] if self.keys else None


class IndexMachine(RuleBasedStateMachine):
    """The index's rules in the plainest Python: a group's held keys in order, items
    back from a lease first (and nothing else of the group while one is on its way),
    ``group_limit`` leases a group; without ``fair`` the oldest deliverable held item
    goes first, with ``fair`` no group is served twice while another waits."""

    def __init__(self) -> None:
        super().__init__()
        self.index = DeliveryIndex()
        self.groups: dict[str | None, ModelGroup] = {}
        self.marks: dict[bytes, str] = {}
        self.limit: int | None = None
        self.fair = False
        self.n = 0
        self.leases: list[str | None] = []
        self.removed: list[tuple[bytes, str | None, int]] = []
        self.turns = Turns()

    def _group(self, name: str | None) -> ModelGroup:
        return self.groups.setdefault(name, ModelGroup())

    def _drop_idle(self, name: str | None) -> None:
        g = self.groups.get(name)
        if g is not None and g.idle:
            del self.groups[name]

    def _may(self, name: str | None, g: ModelGroup) -> bool:
        return g.head is not None and (self.limit is None or name is None or g.leased < self.limit)

    def _could(self) -> set[str | None]:
        return {name for name, g in self.groups.items() if self._may(name, g)}

    def _key(self) -> bytes:
        self.n += 1
        return k(self.n)

    @rule(limit=st.sampled_from([None, 1, 2]), fair=st.booleans())
    def configure(self, limit: int | None, fair: bool) -> None:
        self.index.configure(QueueConfig(group_limit=limit, fair=fair), T0)
        self.limit, self.fair = limit, fair
        self.turns.forget(every=True)

    @rule(name=st.sampled_from(GROUPS))
    def hold(self, name: str | None) -> None:
        key = self._key()
        self.index.hold(name, key, T0)
        self._group(name).keys.append(key)

    @rule(name=st.sampled_from(GROUPS))
    def admits(self, name: str | None) -> None:
        g = self.groups.get(name)
        expected = g is None or (
            not (g.keys or g.front or g.coming)
            and (self.limit is None or name is None or g.leased < self.limit)
        )
        assert self.index.admits(name, T0) == expected

    @rule(lease=st.booleans())
    def take(self, lease: bool) -> None:
        could = self._could()
        assert self.index.has_eligible(T0) == bool(could) or self.fair
        held = self.index.next_held(T0)
        if held is None:
            assert not could
            # a check that finds no group may deliver: each leaves the line, and joins
            # its back again once it may (docs/delivery.md, "In turn")
            self.turns.forget(every=True)
            return
        key, name = held
        assert name in could, (name, could)
        g = self.groups[name]
        assert key == g.head
        if not self.fair:  # the oldest held item that may go
            heads = [self.groups[c].head for c in could]
            assert key == min(h for h in heads if h is not None)
        else:
            self.turns.served(name, could, set())
        if g.front:
            g.front.pop(0)
        else:
            g.keys.pop(0)
        if lease:
            assert self.index.took(name, T0) == name
            g.leased += 1
            self.leases.append(name)
        self.index.done_with(name, T0)
        self._drop_idle(name)

    @rule(name=st.sampled_from(GROUPS))
    def lease_directly(self, name: str | None) -> None:
        self.index.took(name, T0)
        self._group(name).leased += 1
        self.leases.append(name)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def end(self, data: st.DataObject) -> None:
        name = self.leases.pop(data.draw(st.integers(0, len(self.leases) - 1)))
        self.index.ended([(0, FakeLease(name))], T0)
        self.groups[name].leased -= 1
        self._drop_idle(name)

    @rule(name=st.sampled_from(GROUPS[1:]))
    def returning(self, name: str) -> None:
        key = self._key()
        self.index.returning({key: name})
        self.marks[key] = name
        self._group(name).coming += 1

    @precondition(lambda self: self.marks)
    @rule(arrives=st.booleans())
    def cursor_reaches_a_mark(self, arrives: bool) -> None:
        key = min(self.marks)
        name = self.marks.pop(key)
        g = self.groups[name]
        g.coming -= 1
        if arrives:
            self.index.arrive(key, T0)
            g.front = sorted([*g.front, key])
        else:  # cancelled on its way: the cursor passes it
            self.index.passed(key, T0)
            self._drop_idle(name)

    @rule(data=st.data())
    def remove(self, data: st.DataObject) -> None:
        held = [(key, name) for name, g in self.groups.items() for key in g.keys + g.front]
        candidates = held + [(key, None) for key in self.marks]
        if not candidates:
            return
        picked = data.draw(st.lists(st.sampled_from(candidates), max_size=3, unique=True))
        picked.append((self._key(), "a"))  # held by no one: not removed
        expected = []
        for key, name in picked:
            if key in self.marks:
                owner = self.marks.pop(key)
                self.groups[owner].coming -= 1
                expected.append((key, owner, RETURNING))
                continue
            g = self.groups.get(name)
            if g is not None and key in g.front:
                g.front.remove(key)
                expected.append((key, name, FRONT))
            elif g is not None and key in g.keys:
                g.keys.remove(key)
                expected.append((key, name, HELD))
        assert self.index.remove(picked, T0) == expected
        for _key, name, _where in expected:
            self._drop_idle(name)
        self.removed = expected

    @precondition(lambda self: self.removed)
    @rule()
    def put_back(self) -> None:
        self.index.put_back(self.removed, T0)
        for key, name, where in self.removed:
            g = self._group(name)
            if where == RETURNING:
                assert name is not None
                self.marks[key] = name
                g.coming += 1
            elif where == FRONT:
                g.front = sorted([*g.front, key])
            else:
                g.keys = sorted([*g.keys, key])
        self.removed = []

    @invariant()
    def agrees(self) -> None:
        index, groups = self.index, self.groups
        held = sorted((key, name) for name, g in groups.items() for key in g.keys + g.front)
        assert index.indexed == len(held)
        assert index.held_after(b"", 10**6) == held
        assert index.oldest_key() == (held[0][0] if held else None)
        assert index.group_count == len(groups), (index.group_names(), list(groups))
        for name, g in groups.items():
            assert index.group_state(name) == (name, g.leased, len(g.keys) + len(g.front), g.coming)
        assert index.returning_count == len(self.marks)
        assert index.taken == len(self.leases)
        blocked = sum(len(g.keys) + len(g.front) for n, g in groups.items() if not self._may(n, g))
        assert index.held_back(T0) == blocked
        assert sorted(index.busiest(1000, T0), key=repr) == sorted(
            (
                (
                    n,
                    g.leased,
                    len(g.keys) + len(g.front),
                    0 if self._may(n, g) else len(g.keys) + len(g.front),
                )
                for n, g in groups.items()
            ),
            key=repr,
        )


IndexMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestIndexMachine = IndexMachine.TestCase
