"""Item operations that write: release, requeue, extend, lease expiry, tombstones
(which also carry moves to a dead-letter queue).

Invariant (``storage/queue.py``): every pending entry at or below the cursor is leased
or cancelled by a tombstone written (or being written); a new or moved entry is placed
strictly after the cursor (``_place``). A lease taken for a release or requeue is put
back if its record is refused (the batch's ``restore``).
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.storage.codec import PENDING_HEADER, encode_stats, tombstone_of
from dq.storage.errors import ReplicationStalled, StorageError
from dq.storage.group_commit import PendingBatch
from dq.storage.leases import Lease
from dq.storage.queue_core import QueueCore
from dq.storage.types import Extend, ItemOutcome, Release, Requeue
from dq.storage.validation import check_lease_ms, resolve_deadline
from dq.storage.write_future import resolved

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["ItemsMixin"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class ItemsMixin(QueueCore):
    """The write operations on a queue's items."""

    # ------------------------------------------------------------------ writes

    def _requeue_locked(
        self: Queue, moves: list[tuple[int, Lease, int]], now: int, outcomes: list[ItemOutcome]
    ) -> tuple[bytes, list[tuple[bytes, bytes, bytes]], list[bytes]] | None:
        """Build a record moving leased items to new deadlines (pending + tombstone)."""
        parts: list[bytes] = []
        pend: list[tuple[bytes, bytes, bytes]] = []
        tombs: list[bytes] = []
        pack = PENDING_HEADER.pack
        for item_id, lease, deadline in moves:
            found = self.files.lookup(lease.key, lease.source)
            if found is None:
                log.error("queue %s: value of item %d not found; left pending", self.name, item_id)
                continue
            deadline, key = self._place(deadline, item_id)
            st = encode_stats(lease.enqueue_time, now, lease.dequeue_count)
            value = found[1]
            parts.append(pack(key, st, len(value)))
            parts.append(value)
            tomb = tombstone_of(lease.key)
            parts.append(tomb)
            pend.append((key, st, value))
            tombs.append(tomb)
            outcomes.append(ItemOutcome(item_id, deadline=deadline))
        if not parts:
            return None
        return b"".join(parts), pend, tombs

    def _write_moves(
        self: Queue,
        built: tuple[bytes, list[tuple[bytes, bytes, bytes]], list[bytes]],
        result: Any,
        restore: list[tuple[int, Lease]],
    ) -> Future[Any]:
        """Submit a record of moves (``_requeue_locked``); a refusal gives back ``restore``."""
        payload, pend, tombs = built
        token = self.commit.hold(min(k for k, _, _ in pend))
        batch = PendingBatch(
            self.files.memseg,
            result,
            entries=pend,
            behind=len(tombs),
            token=token,
            restore=restore,
            wakes=True,
        )
        return self._submit(batch, payload)

    def release(self: Queue, items: Sequence[Release]) -> Future[list[ItemOutcome]]:
        now = self.engine.now()
        outcomes: list[ItemOutcome] = []
        with self.lock:
            self.check_open()
            taken: list[tuple[int, Lease]] = []
            for r in items:
                try:
                    lease = self.leases.check(r.id, r.receipt, self.next_id, now)
                except StorageError as exc:
                    outcomes.append(ItemOutcome(r.id, exc.code, exc.message))
                    continue
                self.leases.pop(r.id)
                taken.append((r.id, lease))
                outcomes.append(ItemOutcome(r.id))
            if not taken:
                return resolved(outcomes)
            self.rates.add("release", len(taken), now)
            fut = self._write_tombstones(
                [tombstone_of(lease.key) for _, lease in taken], outcomes, taken
            )
        self.engine.emit("released", self.name, [i for i, _ in taken])
        return fut

    def requeue(self: Queue, items: Sequence[Requeue]) -> Future[list[ItemOutcome]]:
        now = self.engine.now()
        results: dict[int, ItemOutcome] = {}
        order: list[int] = []
        with self.lock:
            self.check_open()
            moves: list[tuple[int, Lease, int]] = []
            taken: list[tuple[int, Lease]] = []
            for r in items:
                order.append(r.id)
                try:
                    deadline = resolve_deadline(r.deadline, r.delay_ms, now)
                    lease = self.leases.check(r.id, r.receipt, self.next_id, now)
                except StorageError as exc:
                    results[r.id] = ItemOutcome(r.id, exc.code, exc.message)
                    continue
                self.leases.pop(r.id)
                taken.append((r.id, lease))
                moves.append((r.id, lease, deadline))
            moved: list[ItemOutcome] = []
            built = self._requeue_locked(moves, now, moved)
            for o in moved:
                results[o.id] = o
            outcomes = [
                results.get(i, ItemOutcome(i, "item_not_found", "value not found")) for i in order
            ]
            if built is None:
                return resolved(outcomes)
            fut = self._write_moves(built, outcomes, taken)
        self.engine.emit("requeued", self.name, [o.id for o in moved])
        return fut

    def extend(self: Queue, items: Sequence[Extend]) -> list[ItemOutcome]:
        now = self.engine.now()
        out: list[ItemOutcome] = []
        with self.lock:
            self.check_open()
            for e in items:
                try:
                    check_lease_ms(e.lease_ms)
                    lease = self.leases.check(e.id, e.receipt, self.next_id, now)
                except StorageError as exc:
                    out.append(ItemOutcome(e.id, exc.code, exc.message))
                    continue
                self.leases.extend(e.id, lease, now + e.lease_ms)
                out.append(
                    ItemOutcome(
                        e.id,
                        receipt=self.leases.receipt(e.id, lease),
                        lease_expires=now + e.lease_ms,
                    )
                )
        return out

    def expire_leases(self: Queue) -> int:
        now = self.engine.now()
        with self.lock:
            if self.closed or self.health.failed is not None:
                return 0
            n = self.requeue_expired(now)
        return n

    def requeue_expired(self: Queue, now: int) -> int:
        expired = self.leases.pop_expired(now)
        if not expired:
            return 0
        self.lease_expired += len(expired)
        moved: list[ItemOutcome] = []
        built = self._requeue_locked([(i, lease, now) for i, lease in expired], now, moved)
        if built is not None:
            try:
                self._write_moves(built, moved, expired)
            except ReplicationStalled:
                # a stalled replica group takes no write: the leases are put back as
                # they were (expired), and a later look moves their items again
                self.lease_expired -= len(expired)
                return 0
            self.engine.emit("lease_expired", self.name, [o.id for o in moved])
        return len(expired)

    def tombstone_keys(self: Queue, keys: list[bytes]) -> Future[Any]:
        """Cancel delivered pending entries (a move to a dead-letter queue)."""
        with self.lock:
            self.check_open()
            return self._write_tombstones([tombstone_of(k) for k in keys], None, None)

    def cancel_leased(self: Queue, item_ids: Sequence[int]) -> Future[Any]:
        """Cancel leased items without their receipts (an operator's delete or purge):
        their leases end (receipts go stale) and their entries get tombstones. A refused
        write (a stalled replica group) gives the leases back. Call under the lock, the
        queue checked open."""
        taken = [(i, self.leases.pop(i)) for i in item_ids]
        tombs = [tombstone_of(lease.key) for _, lease in taken]
        return self._write_tombstones(tombs, None, taken)

    def cancel_ahead(self: Queue, pkeys: list[bytes], result: Any = None) -> Future[Any]:
        """Cancel live, unleased items (ahead of the dequeue cursor: an operator's delete,
        purge or redrive). Their tombstones are kept in the in-memory segment (the view
        must see them to skip the items), and until their record is published the first
        key is a barrier dequeue does not pass, so no consumer leases an item whose
        removal is in flight. Call under the lock, the queue checked open."""
        tombs = [tombstone_of(k) for k in pkeys]
        token = self.commit.hold(min(pkeys))
        batch = PendingBatch(
            self.files.memseg, result, entries=[(t, None, None) for t in tombs], token=token
        )
        return self._submit(batch, b"".join(tombs))

    def _write_tombstones(
        self: Queue, tombs: list[bytes], result: Any, restore: list[tuple[int, Lease]] | None
    ) -> Future[Any]:
        """Append the record of ``tombs`` (under the lock, the queue checked open); a
        refusal gives back ``restore``."""
        batch = PendingBatch(self.files.memseg, result, behind=len(tombs), restore=restore)
        return self._submit(batch, b"".join(tombs))
