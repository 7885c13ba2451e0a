"""Item operations that write: enqueue, release, requeue, extend, lease expiry,
tombstones (which also carry moves to a dead-letter queue).

Invariant (``storage/queue.py``): every pending entry at or below the cursor is leased
or cancelled by a tombstone written (or being written); a new or moved entry is placed
strictly after the cursor (``_place``). A lease taken for a release or requeue is put
back if its record is refused (``_restore``).
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dq.storage.codec import PENDING_HEADER, encode_stats, tombstone_of
from dq.storage.dedup import enqueue_keyed
from dq.storage.errors import ReplicationStalled, StorageError, WriteStall
from dq.storage.itemmeta import encode_group_entry, encode_origin_entry
from dq.storage.leases import Lease
from dq.storage.queue_core import QueueCore
from dq.storage.types import Enqueued, Extend, ItemOutcome, Release, Requeue
from dq.storage.validation import check_lease_ms, resolve_deadline
from dq.storage.write_future import resolved

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["ItemsMixin", "Moves"]


@dataclass(slots=True)
class Moves:
    """The record moving leased items to new deadlines: its entries, the pending
    entries and tombstones to publish, and the groups written again with them."""

    payload: bytes
    pend: list[tuple[bytes, bytes, bytes]]
    tombs: list[bytes]
    meta: bytes
    groups: dict[bytes, str]


log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class ItemsMixin(QueueCore):
    """The write operations on a queue's items."""

    # ------------------------------------------------------------------ writes

    def enqueue(
        self: Queue,
        prepared: Sequence[tuple[int, bytes]],
        stats: tuple[int, int, int] | None = None,
        keys: Sequence[str | None] | None = None,
        origin: str | None = None,
        now: int | None = None,
        extra_meta: bytes = b"",
        groups: Sequence[str | None] | None = None,
    ) -> Future[list[Enqueued]]:
        """Enqueue (deadline, value) pairs, already validated. ``stats`` for dead letters
        and redrives; ``keys`` (idempotency), ``origin`` (the queue a dead letter came
        from) and ``groups`` (each item's group or None, validated) travel in the same
        log record as the items (``storage/itemmeta.py``), and so does ``extra_meta``
        (metadata entries of the batch: a schedule's progress); ``now``: the engine's
        clock as the caller read it (read here if not given)."""
        if now is None:
            now = self.engine.now()
        st = encode_stats(*stats) if stats is not None else encode_stats(now, 0, 0)
        pack = PENDING_HEADER.pack
        with self.lock:
            if self.failed is not None or self.closed:
                self.check_open()
            if self.stalled():
                self.retry_rotation()
                self._warn_stalled()
                raise WriteStall("writes are stalled while segment files are written; retry")
            window = self.config.dedup_window_ms
            if keys is not None and window > 0 and any(k is not None for k in keys):
                return enqueue_keyed(self, prepared, st, keys, now, window, extra_meta, groups)
            first = self.next_id
            n = len(prepared)
            self.next_id += n
            parts: list[bytes] = []
            keyed: list[tuple[bytes, bytes]] = []
            results: list[Enqueued] = []
            meta: list[bytes] = []
            cursor = self.cursor
            item_id = first
            for deadline, value in prepared:
                key = ((deadline << 66) | (item_id << 2)).to_bytes(16, "big")  # encode_key
                if key <= cursor:  # placed after the cursor (``Queue._place``)
                    deadline, key = self._place(deadline, item_id)
                parts += (pack(key, st, len(value)), value)
                keyed.append((key, value))
                results.append(Enqueued(item_id, deadline))
                if origin is not None:
                    meta.append(encode_origin_entry(item_id, origin))
                    self.meta.origins[item_id] = origin
                group = None if groups is None else groups[item_id - first]
                if group is not None:
                    meta.append(encode_group_entry(item_id, group))
                item_id += 1
            self.rates.add("enqueue", n, now)
            token = self.hold(keyed[0][0] if n == 1 else min(keyed)[0])
            mem = self.memseg

            published_groups = None if groups is None else list(groups)

            def publish() -> None:
                mem.add_pending(keyed, st, published_groups)
                del self._unpublished[token]
                self.notify()

            def rollback() -> None:
                self._unpublished.pop(token, None)

            fut = self._submit(
                b"".join(parts), publish, results, rollback, b"".join(meta) + extra_meta
            )
        self.engine.emit("enqueued", self.name, range(first, first + n))
        return fut

    def _requeue_locked(
        self: Queue, moves: list[tuple[int, Lease, int]], now: int, outcomes: list[ItemOutcome]
    ) -> Moves | None:
        """Build a record moving leased items to new deadlines (pending + tombstone); a
        grouped item's group is written again with its new entry."""
        parts: list[bytes] = []
        pend: list[tuple[bytes, bytes, bytes]] = []
        tombs: list[bytes] = []
        meta: list[bytes] = []
        groups: dict[bytes, str] = {}
        pack = PENDING_HEADER.pack
        for item_id, lease, deadline in moves:
            found = self.lookup(lease.key, lease.source)
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
            if lease.group is not None:
                meta.append(encode_group_entry(item_id, lease.group))
                groups[key] = lease.group
            outcomes.append(ItemOutcome(item_id, deadline=deadline))
        if not parts:
            return None
        return Moves(b"".join(parts), pend, tombs, b"".join(meta), groups)

    def _write_moves(
        self: Queue,
        built: Moves,
        result: Any,
        rollback: Callable[[], None] | None,
    ) -> Future[Any]:
        pend, tombs, groups = built.pend, built.tombs, built.groups
        token = self.hold(min(k for k, _, _ in pend))
        mem = self.memseg

        def publish() -> None:
            for key, st, value in pend:
                mem.add(key, st, value, groups.get(key))
            for t in tombs:
                mem.add_tombstone_behind(t)
            del self._unpublished[token]
            self.notify()

        def undo() -> None:
            self._unpublished.pop(token, None)
            if rollback is not None:
                rollback()

        return self._submit(built.payload, publish, result, undo, built.meta)

    def _restore(self: Queue, taken: list[tuple[int, Lease]]) -> Callable[[], None]:
        def rollback() -> None:
            for item_id, lease in taken:
                if item_id not in self.leases:
                    self.leases.restore(item_id, lease)

        return rollback

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
                [tombstone_of(lease.key) for _, lease in taken], outcomes, self._restore(taken)
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
            fut = self._write_moves(built, outcomes, self._restore(taken))
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
            if self.closed or self.failed is not None:
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
                self._write_moves(built, moved, self._restore(expired))
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
        return self._write_tombstones(tombs, None, self._restore(taken))

    def cancel_ahead(self: Queue, pkeys: list[bytes], result: Any = None) -> Future[Any]:
        """Cancel live, unleased items (ahead of the dequeue cursor: an operator's delete,
        purge or redrive). Their tombstones are kept in the in-memory segment (the view
        must see them to skip the items), and until their record is published the first
        key is a barrier dequeue does not pass, so no consumer leases an item whose
        removal is in flight. Call under the lock, the queue checked open."""
        tombs = [tombstone_of(k) for k in pkeys]
        token = self.hold(min(pkeys))
        mem = self.memseg

        def publish() -> None:
            for t in tombs:
                mem.add(t, None, None)
            del self._unpublished[token]

        def rollback() -> None:
            self._unpublished.pop(token, None)

        return self._submit(b"".join(tombs), publish, result, rollback)

    def _write_tombstones(
        self: Queue, tombs: list[bytes], result: Any, rollback: Callable[[], None] | None
    ) -> Future[Any]:
        """Append the record of ``tombs`` (under the lock, the queue checked open)."""
        mem = self.memseg

        def publish() -> None:
            mem.add_tombstones_behind(len(tombs))

        return self._submit(b"".join(tombs), publish, result, rollback)
