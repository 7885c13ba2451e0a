"""What dequeue has handed out: how far it has read (the cursor, the last dequeued key)
and what is still out (the leases).

Invariant (the queue's, ``storage/queue.py``): every pending entry whose key is at or
below the cursor is either leased, or cancelled by a tombstone that has been (or is
being) written. So dequeue never looks behind the cursor (``take``), and a new or moved
entry is placed strictly after it (``place``: its deadline advanced if needed;
docs/storage.md: "deadline can never be before the oldest dequeued item"). Nothing here
is durable: after a restart the cursor starts again and every unreleased item is
pending again (at-least-once).
"""

from __future__ import annotations

from collections.abc import Sequence

from dq.storage.codec import MAX_DEADLINE, MAX_ID, decode_stats, encode_key, key_deadline, key_id
from dq.storage.errors import StorageError
from dq.storage.leases import Lease, Leases
from dq.storage.types import DeadEntry, Delivery, Extend, ItemOutcome, ItemStats, Release
from dq.storage.validation import check_lease_ms
from dq.storage.view import MergedView

__all__ = ["Deliveries"]


class Deliveries:
    """The cursor and the leases of one queue; every method runs under the queue's lock."""

    def __init__(self) -> None:
        self.leases = Leases()
        #: the last key dequeue handed out (b"": nothing yet)
        self.cursor = b""

    def reset(self) -> None:
        """Forget every delivery (the queue reloads from disk: they are pending again)."""
        self.leases = Leases()
        self.cursor = b""

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
    ) -> tuple[list[Delivery], list[DeadEntry]]:
        """Lease up to ``count`` live entries of ``view`` after the cursor, up to the key
        ``limit`` and short of ``barrier``, and move the cursor past them. Entries
        delivered ``max_deliveries`` times already are passed over and returned apart
        (key, stats, value, group), for the dead-letter queue."""
        out: list[Delivery] = []
        dead: list[DeadEntry] = []
        leases = self.leases
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
            receipt = leases.add(item_id, key, (enq, req, cnt), expires, source, now, group)
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

    def end(
        self, items: Sequence[Release], next_id: int, now: int
    ) -> tuple[list[tuple[int, Lease]], list[ItemOutcome]]:
        """End the deliveries ``items`` name (a release): the leases taken, and an
        outcome per item (why not, for a receipt that names no live delivery)."""
        leases = self.leases
        taken: list[tuple[int, Lease]] = []
        outcomes: list[ItemOutcome] = []
        for r in items:
            try:
                lease = leases.check(r.id, r.receipt, next_id, now)
            except StorageError as exc:
                outcomes.append(ItemOutcome(r.id, exc.code, exc.message))
                continue
            leases.pop(r.id)
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
                lease = leases.check(e.id, e.receipt, next_id, now)
            except StorageError as exc:
                out.append(ItemOutcome(e.id, exc.code, exc.message))
                continue
            leases.extend(e.id, lease, now + e.lease_ms)
            out.append(
                ItemOutcome(
                    e.id, receipt=leases.receipt(e.id, lease), lease_expires=now + e.lease_ms
                )
            )
        return out

    def give_back(self, taken: list[tuple[int, Lease]]) -> None:
        """Put back leases taken for a write that was refused: the same deliveries, so
        their receipts still work (a refusal changes nothing)."""
        leases = self.leases
        for item_id, lease in taken:
            if item_id not in leases:
                leases.restore(item_id, lease)

    def next_wakeup(self, view: MergedView, paused: bool) -> int | None:
        """When something may next be due: the first deadline after the cursor (none
        while paused) or the first lease to run out."""
        top = None if paused else view.peek(self.cursor)
        times = [key_deadline(top[0])] if top is not None else []
        exp = self.leases.next_expiry()
        if exp is not None:
            times.append(exp)
        return min(times) if times else None
