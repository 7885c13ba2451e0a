"""``Deliveries``, the queue's cursor and leases, on its own: dequeue's walk of the merged
view (key order, up to now, short of the barrier of unpublished writes, dead letters
set apart), keys placed after the cursor, and the leases a release ends, a refusal
gives back and an extend lengthens."""

from __future__ import annotations

from dq.storage.codec import MAX_ID, TOMBSTONE, encode_key, encode_stats, key_deadline, key_id
from dq.storage.deliveries import Deliveries
from dq.storage.memseg import MemSegment
from dq.storage.types import Extend, Release
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
