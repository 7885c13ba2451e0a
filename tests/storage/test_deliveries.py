"""``Deliveries``, the queue's cursor and leases, on its own: dequeue's walk of the merged
view (key order, up to now, short of the barrier of unpublished writes, dead letters
set apart), keys placed after the cursor, and the leases a release ends, a refusal
gives back and an extend lengthens."""

from __future__ import annotations

import os
import random
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from dq.storage import deliveries, segment
from dq.storage.codec import (
    MAX_ID,
    TOMBSTONE,
    encode_key,
    encode_pending,
    encode_stats,
    key_deadline,
    key_id,
    tombstone_of,
)
from dq.storage.deliveries import Deliveries
from dq.storage.memseg import MemSegment
from dq.storage.segment import write_segment_grouped
from dq.storage.types import Extend, QueueConfig, Release
from dq.storage.view import MergedView

NOW = 1_000_000


def view_of(*items: tuple[int, int, int]) -> MergedView:
    """A view over one in-memory segment holding (deadline, id, delivery count) items."""
    mem = MemSegment(1)
    for deadline, item_id, count in items:
        mem.add(encode_key(deadline, item_id), encode_stats(1, 0, count), b"v%d" % item_id)
    view = MergedView()
    view.memsegs = [mem]
    return view


def upto(now: int) -> bytes:
    return encode_key(now, MAX_ID, TOMBSTONE)


def test_take_leases_what_is_due_in_key_order_and_moves_the_cursor_past_it() -> None:
    d = Deliveries()
    view = view_of((NOW - 10, 1, 0), (NOW - 50, 2, 0), (NOW + 100, 3, 0))
    out, dead = d.take(view, upto(NOW), None, 10, NOW + 30_000, NOW, None)
    assert [x.id for x in out] == [2, 1] and dead == []
    assert [x.deadline for x in out] == [NOW - 50, NOW - 10]
    assert all(x.stats.dequeue_count == 1 and x.lease_expires == NOW + 30_000 for x in out)
    assert (key_deadline(d.cursor), key_id(d.cursor)) == (NOW - 10, 1)
    assert len(d.leases) == 2
    assert d.take(view, upto(NOW), None, 10, NOW + 30_000, NOW, None) == ([], [])
    later, _ = d.take(view, upto(NOW + 100), None, 10, NOW + 30_000, NOW, None)
    assert [x.id for x in later] == [3]


def test_take_takes_at_most_count_and_the_next_take_goes_on_from_the_cursor() -> None:
    d = Deliveries()
    view = view_of(*((NOW - i, i, 0) for i in range(1, 6)))
    first, _ = d.take(view, upto(NOW), None, 2, NOW + 1, NOW, None)
    second, _ = d.take(view, upto(NOW), None, 10, NOW + 1, NOW, None)
    assert [x.id for x in first] == [5, 4] and [x.id for x in second] == [3, 2, 1]


def test_take_stops_short_of_the_barrier_of_an_unpublished_write() -> None:
    d = Deliveries()
    view = view_of((NOW - 50, 2, 0), (NOW - 10, 1, 0))
    barrier = encode_key(NOW - 10, 1)
    out, _ = d.take(view, upto(NOW), barrier, 10, NOW + 1, NOW, None)
    assert [x.id for x in out] == [2]
    assert d.cursor < barrier  # the cursor never passes an entry not visible yet
    out, _ = d.take(view, upto(NOW), None, 10, NOW + 1, NOW, None)
    assert [x.id for x in out] == [1]


def test_an_item_delivered_max_deliveries_times_is_set_apart_not_leased() -> None:
    d = Deliveries()
    view = view_of((NOW - 20, 1, 3), (NOW - 10, 2, 2))
    out, dead = d.take(view, upto(NOW), None, 10, NOW + 1, NOW, 3)
    assert [x.id for x in out] == [2] and out[0].stats.dequeue_count == 3
    assert [key_id(e[0]) for e in dead] == [1] and dead[0][2] == b"v1" and dead[0][3] is None
    assert 1 not in d.leases and key_id(d.cursor) == 2


def test_place_puts_a_key_after_the_cursor() -> None:
    d = Deliveries()
    assert d.place(5, 7) == (5, encode_key(5, 7))  # nothing dequeued yet
    d.take(view_of((NOW, 5, 0)), upto(NOW), None, 1, NOW + 1, NOW, None)
    assert d.place(NOW - 100, 7) == (NOW, encode_key(NOW, 7))  # a later id sorts after
    assert d.place(NOW - 100, 3) == (NOW + 1, encode_key(NOW + 1, 3))  # an earlier one not
    assert d.place(NOW + 5, 3) == (NOW + 5, encode_key(NOW + 5, 3))  # already after


def test_end_ends_live_deliveries_and_says_why_not_for_the_rest() -> None:
    d = Deliveries()
    (x,) = d.take(view_of((NOW, 1, 0)), upto(NOW), None, 1, NOW + 1000, NOW, None)[0]
    taken, outcomes = d.end(
        [Release(1, x.receipt), Release(1, "nonsense"), Release(9, x.receipt)], 2, NOW
    )
    assert [i for i, _ in taken] == [1]
    assert [o.error for o in outcomes] == [None, "invalid_receipt", "invalid_receipt"]
    assert d.end([Release(1, x.receipt)], 2, NOW)[1][0].error == "stale_receipt"
    d.give_back(taken)  # the write was refused: the same delivery goes on
    assert d.end([Release(1, x.receipt)], 2, NOW)[1][0].error is None


def test_a_lease_that_ran_out_cannot_be_ended_or_extended() -> None:
    d = Deliveries()
    (x,) = d.take(view_of((NOW, 1, 0)), upto(NOW), None, 1, NOW + 1000, NOW, None)[0]
    assert d.extend([Extend(1, x.receipt, 5000)], 2, NOW + 1000)[0].error == "stale_receipt"
    assert d.end([Release(1, x.receipt)], 2, NOW + 1000)[1][0].error == "stale_receipt"


def test_extend_lengthens_a_lease_and_answers_its_receipt() -> None:
    d = Deliveries()
    (x,) = d.take(view_of((NOW, 1, 0)), upto(NOW), None, 1, NOW + 1000, NOW, None)[0]
    (o,) = d.extend([Extend(1, x.receipt, 5000)], 2, NOW + 500)
    assert (o.error, o.receipt, o.lease_expires) == (None, x.receipt, NOW + 5500)
    assert d.leases.pop_expired(NOW + 5499) == []
    assert d.extend([Extend(1, x.receipt, 0)], 2, NOW)[0].error == "validation_error"


def test_next_wakeup_is_the_next_deadline_or_lease_end_whichever_is_first() -> None:
    d = Deliveries()
    view = view_of((NOW, 1, 0), (NOW + 5000, 2, 0))
    assert d.next_wakeup(view, paused=False, now=NOW) == NOW
    d.take(view, upto(NOW), None, 1, NOW + 1000, NOW, None)
    assert d.next_wakeup(view, paused=False, now=NOW) == NOW + 1000  # the lease, before item 2
    assert d.next_wakeup(view, paused=True, now=NOW) == NOW + 1000  # paused: leases still end
    d.reset()
    assert d.cursor == b"" and len(d.leases) == 0
    assert d.next_wakeup(view, paused=True, now=NOW) is None


# -------------------------------------------------- stretches of one source, under rules


def _sources(
    rnd: random.Random, root: str, n: int
) -> tuple[list[str], list[MemSegment], dict[bytes, tuple[bytes, bytes]], set[int]]:
    """``n`` items spread over two segment files of small blocks and two in-memory
    segments: some with a second copy (the same key from an earlier server lifetime) in
    another source or in the same file (a merge writes it twice), some cancelled by a
    tombstone in their own source or another one, all due. The files' paths, the
    in-memory segments, (stats, value) by key, and the ids of the live items."""
    files: list[list[tuple[bytes, bytes, str | None]]] = [[], []]
    mems = [MemSegment(1), MemSegment(2)]
    found: dict[bytes, tuple[bytes, bytes]] = {}
    live: set[int] = set()

    def put(where: int, key: bytes, stats: bytes | None, value: bytes, group: str | None) -> None:
        if where < 2:
            entry = key if stats is None else encode_pending(key, stats, value)
            files[where].append((key, entry, group))
        else:
            mems[where - 2].add(key, stats, None if stats is None else value, group)

    for item_id in range(1, n + 1):
        key = encode_key(NOW - 500 + rnd.randrange(0, 3 * n), item_id)
        group = rnd.choice(["a", "b", "c", "d", None])
        value, stats = b"v%d" % item_id, encode_stats(1, 0, 0)
        where = rnd.randrange(4)
        put(where, key, stats, value, group)
        found[key] = (stats, value)
        copies = 1
        if rnd.random() < 0.15:  # in another source, or a second copy in a merged file
            again = where if where < 2 and rnd.random() < 0.5 else (where + rnd.randrange(1, 4)) % 4
            put(again, key, stats, value, group)
            copies = 2
        if rnd.random() < 0.3:  # cancelled (a copy outnumbers its one tombstone)
            put(rnd.choice([where, rnd.randrange(4)]), tombstone_of(key), None, b"", None)
            copies -= 1
        if copies:
            live.add(item_id)
    paths = []
    for i, entries in enumerate(files):
        if entries:
            path = os.path.join(root, f"{i}.seg")
            entries.sort(key=lambda e: e[0])
            write_segment_grouped(path, entries, seg_lo=1, seg_hi=1, max_id=n)
            paths.append(path)
    return paths, mems, found, live


def _walk(
    view: MergedView,
    found: dict[bytes, tuple[bytes, bytes]],
    n: int,
    counts: list[int],
    barrier: bytes | None,
    seed: int,
    leased_limit: int | None,
    fair: bool,
) -> tuple[list[tuple[list[tuple[int, bytes, str | None]], bytes]], int]:
    """Dequeues of ``counts`` items with ``group_limit`` 1 (and ``leased_limit``, and
    ``fair``), leases ended at random in between, then until every item is out: each
    one's deliveries and cursor."""
    d = Deliveries()
    config = QueueConfig(group_limit=1, leased_limit=leased_limit, fair=fair)
    d.index.configure(config, NOW)
    rnd = random.Random(seed)
    steps = []
    receipts: dict[int, str] = {}
    for count in [*counts, *[1000] * (n + 2)]:
        if count == 1000:  # draining: every lease ends, nothing is short of a barrier
            barrier = None
            ends = [Release(i, r) for i, r in receipts.items()]
        else:
            ends = [Release(i, r) for i, r in receipts.items() if rnd.random() < 0.6]
        taken, _ = d.end(ends, n + 1, NOW)
        d.ended(taken, NOW)
        for r in ends:
            del receipts[r.id]
        got, dead = d.take(
            view, upto(NOW), barrier, count, NOW + 1, NOW, None, lambda k, _h: found.get(k)
        )
        assert dead == []
        receipts.update((x.id, x.receipt) for x in got)
        steps.append(([(x.id, x.value, x.group) for x in got], d.cursor))
    return steps, d.index.indexed


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    n=st.integers(1, 60),
    counts=st.lists(st.integers(1, 6)),
    leased_limit=st.sampled_from([None, 2, 5]),
    fair=st.booleans(),
)
def test_under_rules_take_passes_stretches_of_one_source_as_the_merge_does_entry_by_entry(
    seed: int, n: int, counts: list[int], leased_limit: int | None, fair: bool
) -> None:
    """With ``group_limit`` 1, dequeue reads runs of one source's entries as a stretch
    (``MergedView.run``): it hands out and holds exactly what reading the merge entry by
    entry hands out and holds, across block ends, copies of a key, tombstones in any
    source, a barrier, a ``leased_limit`` and ``fair`` (which reads stretches into the
    index whole), with leases ending between dequeues; every live item once."""
    rnd = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        target = segment.BLOCK_TARGET
        segment.BLOCK_TARGET = 150  # a few entries a block: stretches meet block ends
        try:
            paths, mems, found, live = _sources(rnd, root, n)
        finally:
            segment.BLOCK_TARGET = target
        barrier = encode_key(NOW - 500 + rnd.randrange(0, 3 * n), MAX_ID) if seed % 2 else None
        walks = []
        stretch = deliveries.STRETCH
        deliveries.STRETCH = 0  # an in-memory segment read two entries a delivery at a time
        try:
            for stretches in (True, False):
                view = MergedView()
                for p in paths:
                    view.add_segment(segment.SegmentReader(p), b"")
                view.memsegs = list(mems)
                if not stretches:  # the merge read entry by entry (``next_live``) only
                    view.run = lambda *_args: None  # type: ignore[method-assign]
                walks.append(_walk(view, found, n, counts, barrier, seed, leased_limit, fair))
        finally:
            deliveries.STRETCH = stretch
        assert walks[0] == walks[1]
        delivered = [i for got, _cursor in walks[0][0] for i, _v, _g in got]
        assert sorted(delivered) == sorted(live) and walks[0][1] == 0


def test_a_stretch_read_from_an_in_memory_segment_stops_where_a_tombstone_may_follow() -> None:
    """A stretch of ``size`` keys of an in-memory segment leaves out its last key, whose
    tombstone may be the next key (not read); one cut short by the segment's end keeps
    it; a tombstone inside the stretch ends it before the entry it cancels."""
    mem = MemSegment(1)
    keys = [encode_key(NOW - 10, i) for i in range(1, 5)]
    stats = encode_stats(1, 0, 0)
    for k in keys:
        mem.add(k, stats, b"v", "a")
    mem.add(tombstone_of(keys[1]), None, None)
    view = MergedView()
    view.memsegs = [mem]
    two = view.run(b"", upto(NOW), None, 2)  # keys 1 and 2 read; 2's tombstone is next
    assert two is not None and two.keys[two.pos : two.end] == keys[:1]
    assert two.groups == ["a"] and two.entry(0) == (stats, b"v")
    cut = view.run(b"", upto(NOW), None, 10)
    assert cut is not None and cut.keys[cut.pos : cut.end] == keys[:1]
    rest = view.run(tombstone_of(keys[1]), upto(NOW), None, 10)
    assert rest is not None and rest.keys[rest.pos : rest.end] == keys[2:]
