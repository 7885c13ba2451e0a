"""What dequeue has handed out: how far it has read (the cursor, the last dequeued key),
what is still out (the leases, ``storage/_leases.c``), and what the delivery rules hold
back (the index).

Invariant (the queue's, ``storage/queue.py``): every pending entry whose key is at or
below the cursor is either leased, held back by the delivery index
(``storage/_delivery.c``), or cancelled by a tombstone that has been (or is being)
written. So dequeue never looks behind the cursor but through the index (``take``), and
a new or moved entry is placed strictly after it (``place``: its deadline advanced if
needed; docs/storage.md: "deadline can never be before the oldest dequeued item").
Nothing here is durable: after a restart the cursor starts again, nothing is held, and
every unreleased item is pending again (at-least-once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dq.storage._delivery import MAX_HELD, READ_BUDGET, WINDOW, DeliveryIndex
from dq.storage._leases import Lease, Leases
from dq.storage.codec import MAX_DEADLINE, MAX_ID, decode_stats, encode_key, key_deadline, key_id
from dq.storage.errors import StorageError
from dq.storage.types import DeadEntry, Delivery, Extend, ItemOutcome, ItemStats, Release
from dq.storage.validation import check_lease_ms
from dq.storage.view import MergedView, Stretch

__all__ = ["Deliveries"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs

#: entries of an in-memory segment read as one stretch, beyond two a delivery asked for
STRETCH = 16

#: (stats, value) of a pending entry by its key, wherever it lives (``SegmentSet.lookup``)
Lookup = Callable[[bytes, object | None], tuple[bytes, bytes] | None]


class Deliveries:
    """The cursor and the leases of one queue; every method runs under the queue's lock."""

    def __init__(self) -> None:
        self.leases = Leases()
        #: the last key dequeue passed (b"": nothing yet)
        self.cursor = b""
        #: slots, held items and eligible groups of the delivery rules
        self.index = DeliveryIndex()

    def reset(self) -> None:
        """Forget every delivery (the queue reloads from disk: they are pending again)."""
        self.leases = Leases()
        self.cursor = b""
        self.index.reset()

    def place(self, deadline: int, item_id: int) -> tuple[int, bytes]:
        """Key for (deadline, id), deadline advanced so the key sorts after the cursor."""
        key = encode_key(deadline, item_id)
        cursor = self.cursor
        if key <= cursor:
            cd = key_deadline(cursor)
            deadline = cd if item_id > key_id(cursor) else cd + 1
            key = encode_key(deadline, item_id)
        return deadline, key

    def take(
        self,
        view: MergedView,
        limit: bytes,
        barrier: bytes | None,
        count: int,
        expires: int,
        now: int,
        max_deliveries: int | None,
        lookup: Lookup | None = None,
    ) -> tuple[list[Delivery], list[DeadEntry]]:
        """Lease up to ``count`` live entries of ``view`` after the cursor, up to the key
        ``limit`` and short of ``barrier``, and move the cursor past them. Entries
        delivered ``max_deliveries`` times already are passed over and returned apart
        (key, stats, value, group), for the dead-letter queue. With delivery rules set
        (or items still held by them) the index chooses (``_take_ruled``); ``lookup``
        reads a held item's entry."""
        index = self.index
        if index.active:
            assert lookup is not None
            return self._take_ruled(
                view, limit, barrier, count, expires, now, max_deliveries, lookup
            )
        out: list[Delivery] = []
        dead: list[DeadEntry] = []
        leases = self.leases
        took = index.took
        after = self.cursor
        from_bytes = int.from_bytes
        while len(out) < count:
            after, hit = view.next_live(after, limit, barrier)
            if hit is None:
                break
            key, stats, value, source, group = hit
            enq, req, cnt = decode_stats(stats)
            # ``key_id`` and ``key_deadline`` of the key, read once (``docs/format.md``)
            k = from_bytes(key, "big")
            item_id = (k >> 2) & MAX_ID
            if max_deliveries is not None and cnt >= max_deliveries:
                dead.append((key, stats, value, group))
                continue
            cnt += 1
            group = took(group, now)  # the index's string of the name, shared
            receipt = leases.add(item_id, key, enq, req, cnt, expires, source, now, group)
            out.append(
                Delivery(
                    item_id,
                    receipt,
                    value,
                    (k >> 66) & MAX_DEADLINE,
                    ItemStats(enq, req, cnt),
                    expires,
                    group,
                )
            )
        self.cursor = after
        return out, dead

    def _take_ruled(
        self,
        view: MergedView,
        limit: bytes,
        barrier: bytes | None,
        count: int,
        expires: int,
        now: int,
        max_deliveries: int | None,
        lookup: Lookup,
    ) -> tuple[list[Delivery], list[DeadEntry]]:
        """``take`` under the delivery rules (``storage/_delivery.c``): each round hands
        out the next eligible held item if there is one (held items lie behind the
        cursor: older than anything the view has), else reads the view on, holding
        what may not go now. With ``fair`` the view is read into the index first and
        the groups take turns."""
        index = self.index
        out: list[Delivery] = []
        dead: list[DeadEntry] = []
        after = self.cursor
        fair = index.fair
        admits, hold = index.admits, index.hold
        index.tick(now)
        budget = READ_BUDGET
        if fair:
            after, budget = self._read_ahead(view, after, limit, barrier, now, budget)
        while len(out) < count:
            if not index.queue_open(now):
                if not index.at_leased_limit() and (
                    index.has_eligible(now) or _due_ahead(view, after, limit, barrier)
                ):
                    index.rate_refused += 1
                break
            held = index.next_held(now)
            if held is not None:
                key, name = held
                found = lookup(key, None)
                if found is None:  # not where any source says: left for a restart to find
                    log.error("held item %d not found; left pending", key_id(key))
                else:
                    self._hand_out(
                        key,
                        found[0],
                        found[1],
                        None,
                        name,
                        expires,
                        now,
                        max_deliveries,
                        out,
                        dead,
                    )
                index.done_with(name, now)
                continue
            if fair:  # nothing may go now: read further ahead, within the budget
                read_from = after
                if budget > 0 and not index.full:
                    after, budget = self._read_ahead(view, after, limit, barrier, now, budget)
                if after == read_from:
                    break
                continue
            if index.indexed >= MAX_HELD:
                break
            # items on their way back from expired leases are looked for one entry at a time
            returning = index.returning_count
            run = None if returning else view.run(after, limit, barrier, STRETCH + 2 * count)
            if run is not None:
                after = self._take_stretch(
                    view, run, count, expires, now, max_deliveries, out, dead
                )
                continue
            after, hit = view.next_live(after, limit, barrier)
            if hit is None:
                if index.passed(after, now):
                    continue  # a group was waiting for an item that is gone: it goes on
                break
            key, stats, value, source, group = hit
            if returning:  # items are on their way back from expired leases
                if index.is_returning(key):
                    index.arrive(key, now)
                elif index.admits(group, now):
                    self._hand_out(
                        key, stats, value, source, group, expires, now, max_deliveries, out, dead
                    )
                else:
                    index.hold(group, key, now)
                index.passed(after, now)
                continue
            # Entries held back go straight on to the next: a hold makes no group eligible
            # and takes no token, so what the round checked above still holds. Each is
            # passed once, with a few plain calls.
            while not admits(group, now):
                hold(group, key, now)
                if index.indexed >= MAX_HELD:
                    hit = None
                    break
                after, hit = view.next_live(after, limit, barrier)
                if hit is None:
                    break
                key, stats, value, source, group = hit
            if hit is None:
                break
            self._hand_out(
                key, stats, value, source, group, expires, now, max_deliveries, out, dead
            )
        self.cursor = after
        return out, dead

    def _take_stretch(
        self,
        view: MergedView,
        run: Stretch,
        count: int,
        expires: int,
        now: int,
        max_deliveries: int | None,
        out: list[Delivery],
        dead: list[DeadEntry],
    ) -> bytes:
        """``_take_ruled``'s rounds along a stretch of one source that no other
        interleaves (``MergedView.run``): entries that may not go now are held, the
        others handed out, until ``count`` or the stretch's end — or the queue may hand
        out no more, or the index is full, which the caller's next round sees. Neither
        a hold nor a hand-out makes a held item eligible, so the rounds need not ask
        the index for one. The cursor's new position."""
        index = self.index
        keys, groups, source, end = run.keys, run.groups, run.source, run.end
        hold_run, hand_out, entry = index.hold_run, self._hand_out, run.entry
        i = run.pos
        while True:
            i = hold_run(keys, groups, i, end, now)
            if i == end or index.indexed >= MAX_HELD:
                break
            stats, value = entry(i)
            group = None if groups is None else groups[i]
            hand_out(keys[i], stats, value, source, group, expires, now, max_deliveries, out, dead)
            i += 1
            if i == end or len(out) >= count or not index.queue_open(now):
                break
        view.step_to(run, i)
        return keys[i - 1]

    def _read_ahead(
        self,
        view: MergedView,
        after: bytes,
        limit: bytes,
        barrier: bytes | None,
        now: int,
        budget: int,
    ) -> tuple[bytes, int]:
        """With ``fair``: read due entries into the index (up to its window and
        ``budget`` entries), so that their groups take turns. The new cursor position
        and the budget left. While no item is on its way back from an expired lease,
        a stretch of one source (``MergedView.run``) is held whole."""
        index = self.index
        hold = index.hold
        while budget > 0 and not index.full:
            room = min(budget, WINDOW - index.indexed)
            run = None if index.returning_count else view.run(after, limit, barrier, room + 1)
            if run is not None:
                keys, groups, stop = run.keys, run.groups, min(run.end, run.pos + room)
                for i in range(run.pos, stop):
                    hold(None if groups is None else groups[i], keys[i], now)
                view.step_to(run, stop)
                after = keys[stop - 1]
                budget -= stop - run.pos
                continue
            after, hit = view.next_live(after, limit, barrier)
            if hit is None:
                index.passed(after, now)
                break
            budget -= 1
            key = hit[0]
            if index.is_returning(key):
                index.arrive(key, now)
            else:
                index.hold(hit[4], key, now)
            index.passed(after, now)
        return after, budget

    def _hand_out(
        self,
        key: bytes,
        stats: bytes,
        value: bytes,
        source: object | None,
        group: str | None,
        expires: int,
        now: int,
        max_deliveries: int | None,
        out: list[Delivery],
        dead: list[DeadEntry],
    ) -> None:
        """Lease one entry (its slot and token taken), or set it apart for the
        dead-letter queue if it was delivered ``max_deliveries`` times already."""
        enq, req, cnt = decode_stats(stats)
        if max_deliveries is not None and cnt >= max_deliveries:
            dead.append((key, stats, value, group))
            return
        cnt += 1
        k = int.from_bytes(key, "big")
        item_id = (k >> 2) & MAX_ID
        group = self.index.took(group, now)  # the index's string of the name, shared
        receipt = self.leases.add(item_id, key, enq, req, cnt, expires, source, now, group)
        out.append(
            Delivery(
                item_id,
                receipt,
                value,
                (k >> 66) & MAX_DEADLINE,
                ItemStats(enq, req, cnt),
                expires,
                group,
            )
        )

    def end(
        self, items: Sequence[Release], next_id: int, now: int
    ) -> tuple[list[tuple[int, Lease]], list[ItemOutcome]]:
        """End the deliveries ``items`` name (a release): the leases taken, and an
        outcome per item (why not, for a receipt that names no live delivery)."""
        take = self.leases.take
        taken: list[tuple[int, Lease]] = []
        outcomes: list[ItemOutcome] = []
        for r in items:
            try:
                lease = take(r.id, r.receipt, next_id, now)
            except StorageError as exc:
                outcomes.append(ItemOutcome(r.id, exc.code, exc.message))
                continue
            taken.append((r.id, lease))
            outcomes.append(ItemOutcome(r.id))
        return taken, outcomes

    def extend(self, items: Sequence[Extend], next_id: int, now: int) -> list[ItemOutcome]:
        """Lengthen the leases ``items`` name; an outcome (new receipt) per item."""
        leases = self.leases
        out: list[ItemOutcome] = []
        for e in items:
            try:
                check_lease_ms(e.lease_ms)
                receipt = leases.extend(e.id, e.receipt, next_id, now, now + e.lease_ms)
            except StorageError as exc:
                out.append(ItemOutcome(e.id, exc.code, exc.message))
                continue
            out.append(ItemOutcome(e.id, receipt=receipt, lease_expires=now + e.lease_ms))
        return out

    def give_back(self, taken: list[tuple[int, Lease]]) -> None:
        """Put back leases taken for a write that was refused: the same deliveries, so
        their receipts still work (a refusal changes nothing)."""
        leases = self.leases
        for item_id, lease in taken:
            if item_id not in leases:
                leases.restore(item_id, lease)

    def ended(self, taken: list[tuple[int, Lease]], now: int) -> bool:
        """The ends of the leases ``taken`` are durable: their slots are free. True when
        a waiting dequeue may now take something (``DeliveryIndex.ended``)."""
        return self.index.ended(taken, now)

    def next_wakeup(self, view: MergedView, paused: bool, now: int) -> int | None:
        """When something may next be handed out: the first deadline after the cursor,
        a held item that may go now, the next token of a rate limit (none of them while
        paused, or while the queue is at its ``leased_limit``: a slot freed wakes the
        long-polls) — or the first lease to run out."""
        times: list[int] = []
        index = self.index
        if not paused and not (index.active and index.at_leased_limit()):
            if not (index.active and index.full):
                top = view.peek(self.cursor)
                if top is not None:
                    times.append(key_deadline(top[0]))
            if index.active:
                if index.indexed and index.has_eligible(now):
                    times.append(now)
                timer = index.next_timer()
                if timer is not None:
                    times.append(timer)
                token = index.queue_token_at(now)
                if token is not None:  # nothing goes before the queue's next token
                    times = [max(t, token) for t in times]
        exp = self.leases.next_expiry()
        if exp is not None:
            times.append(exp)
        return min(times) if times else None


def _due_ahead(view: MergedView, after: bytes, limit: bytes, barrier: bytes | None) -> bool:
    """The view has an entry up to ``limit`` after ``after`` (perhaps a tombstone: a hint
    for counting refusals, not a promise)."""
    top = view.peek(after)
    return top is not None and top[0] <= limit and (barrier is None or top[0] < barrier)
