"""Framing the log records that move items: an item handed back (requeue, fail, a
lease run out) and a pending item moved by its key (an enqueue with "replace").

A move is one record that writes the item's new pending entry and the tombstone of the
entry it leaves, so a crash keeps either both or neither; the
record also writes again what the item carries — its group, the key that names it, its
reasons (``storage/item_notes.py``) — since a new entry's metadata is read from the log
its entry is in. Framing is kept apart from submitting: the queue frames under its lock
— the record, and for a record of moves its batch (``batch``: its barrier, the leases it
ends, what memory says it carries from then on) — then submits and publishes it as it
does any other (``Queue._write_moves``, ``Queue.rekey``, ``Queue._write_pending``).

Invariant: a moved item's new key is after the dequeue cursor and is a key this log
holds no entry for, pending or cancelled, nor a write on its way to disk
(``fresh_key``): one log holds a key once, so a second entry there would be lost.

It is given the parts it reads — ``GroupCommit`` (writes waiting to be durable, the
barrier a batch holds until it is published),
``SegmentSet`` (the in-memory segment, the values of leased items), ``Deliveries`` (the
cursor) — and the item metadata (``ItemMeta``, replaced when the queue reopens);
every method runs under the queue's lock, and nothing here calls the queue.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dq.storage.codec import (
    PENDING_HEADER,
    decode_stats,
    encode_key,
    encode_stats,
    tombstone_of,
)
from dq.storage.group_commit import PendingBatch
from dq.storage.item_notes import Carried, Carrying, carry
from dq.storage.itemmeta import encode_group_entry, encode_key_entry
from dq.storage.key_moves import KeyState
from dq.storage.reasons import encode_error_entry
from dq.storage.types import Enqueued, ItemOutcome

if TYPE_CHECKING:
    from dq.storage._leases import Lease
    from dq.storage.deliveries import Deliveries
    from dq.storage.group_commit import GroupCommit
    from dq.storage.itemmeta import ItemMeta, Remembered
    from dq.storage.key_moves import Rekey
    from dq.storage.reasons import Reason
    from dq.storage.segment_set import SegmentSet

__all__ = ["MoveFrames", "Moves"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


@dataclass(slots=True)
class Moves:
    """A record moving leased items to new deadlines: its entries, the pending entries
    and tombstones to publish, and the groups, keys and reasons written again with them."""

    payload: bytes
    pend: list[tuple[bytes, bytes, bytes]]
    tombs: list[bytes]
    meta: bytes
    groups: dict[bytes, str]
    #: what each moved item carries besides its group (``storage/item_notes.py``)
    carried: list[Carried]


class MoveFrames:
    """The framing of one queue's moves; every method runs under the queue's lock."""

    def __init__(
        self,
        name: str,
        directory: str,
        commit: GroupCommit,
        files: SegmentSet,
        deliveries: Deliveries,
        meta: ItemMeta,
    ) -> None:
        self.name = name
        self.directory = directory
        self.commit = commit
        self.files = files
        self.deliveries = deliveries
        #: the queue's item metadata (set again when the queue reopens: ``Queue._load``)
        self.meta = meta

    def reasons_of(self, item_id: int) -> tuple[Reason, ...] | None:
        """Why item ``item_id`` failed, newest first (None: it never did), as
        ``Queue.item_reasons`` says: a moved item's reasons are written again."""
        return self.meta.errors.reasons(self.directory, item_id)

    def in_flight(self, pkey: bytes) -> KeyState | None:
        """The entry ``pkey`` as a write waiting to be durable leaves it — written
        (pending), or cancelled — or None if no such write touches it."""
        tomb = tombstone_of(pkey)
        found: KeyState | None = None
        for batch in self.commit.waiting:  # in append order: the last one says
            if batch.keyed is not None:
                for key, value in batch.keyed:
                    if key == pkey:
                        found = KeyState("pending", pkey, batch.stats, value)
            if batch.entries is not None:
                for key, entry_stats, entry_value in batch.entries:
                    if key == pkey and entry_stats is not None and entry_value is not None:
                        found = KeyState("pending", pkey, entry_stats, entry_value)
                    elif key == tomb:
                        found = KeyState("gone", pkey)
        return found

    def group_in_flight(self, pkey: bytes) -> str | None:
        """The group a write waiting to be durable gives the entry ``pkey`` (None: none
        does)."""
        for batch in self.commit.waiting:
            if batch.groups and pkey in batch.groups:
                return batch.groups[pkey]
        return None

    def fresh_key(self, deadline: int, item_id: int, moving: bytes | None) -> tuple[int, bytes]:
        """The key a moved item's new entry takes: (deadline, id) placed after the cursor,
        and 1 ms later while it is a key this log already holds — the item's own earlier
        entry there, pending or cancelled, a move by key ahead of the cursor may come back
        to. One log holds a key once (its in-memory segment keeps one entry a key, a
        freeze one entry a key), so a second would be lost. ``moving``: the pending key
        of an item moved by key, whose own writes may still be on their way to disk,
        and which its new entry must not be either."""
        deadline, key = self.deliveries.place(deadline, item_id)
        entries = self.files.memseg.entries
        while (
            key in entries
            or tombstone_of(key) in entries
            or key == moving
            or (moving is not None and self.in_flight(key) is not None)
        ):
            deadline += 1
            key = encode_key(deadline, item_id)
        return deadline, key

    def rekeys(
        self,
        rekeys: Sequence[Rekey],
        now: int,
        parts: list[bytes],
        entries: list[tuple[bytes, bytes | None, bytes | None]],
        meta: list[bytes],
        groups: dict[bytes, str],
        rekeyed: list[tuple[Remembered, int, int]],
        carried: list[Carried],
    ) -> list[Enqueued]:
        """Frame the moves of pending items by key (under the lock): each item's new
        entry — same id, the new deadline (placed after the cursor, and 1 ms later if it
        would be the very key it leaves) and value, its delivery count kept — the
        tombstone of the entry it leaves (kept in memory: it is ahead of the cursor),
        the key entry naming it there, written now (its window starts again), and its
        reasons. Notes in ``rekeyed`` what each key said before."""
        pack = PENDING_HEADER.pack
        out: list[Enqueued] = []
        for r in rekeys:
            entry, old = r.entry, r.state.pkey
            item_id = entry.id
            deadline, key = self.fresh_key(r.deadline, item_id, old)
            enq, _req, cnt = decode_stats(r.state.stats)
            st = encode_stats(enq, now, cnt)
            tomb = tombstone_of(old)
            parts += (pack(key, st, len(r.value)), r.value, tomb)
            entries += ((key, st, r.value), (tomb, None, None))
            meta.append(encode_key_entry(item_id, deadline, now, r.key.encode()))
            if r.group is not None:
                meta.append(encode_group_entry(item_id, r.group))
                groups[key] = r.group
            reasons = self.reasons_of(item_id)
            if reasons is not None:
                meta.append(encode_error_entry(item_id, deadline, reasons))
                carried.append(Carried(item_id, deadline, None, reasons))
            rekeyed.append((entry, entry.deadline, entry.time))
            entry.deadline, entry.time = deadline, now
            self.meta.remember(r.key, entry)  # its window starts again now
            out.append(Enqueued(item_id, deadline, replaced=True))
        return out

    def moves(
        self,
        moves: Sequence[tuple[int, Lease, int, Reason | None]],
        now: int,
        outcomes: list[ItemOutcome],
    ) -> Moves | None:
        """Frame a record moving leased items to new deadlines (pending + tombstone),
        with what each item carries: its group, written again with its new entry, its
        key and its reasons with ``reason`` (if any) added (``storage/item_notes.py``)."""
        parts: list[bytes] = []
        pend: list[tuple[bytes, bytes, bytes]] = []
        tombs: list[bytes] = []
        meta: list[bytes] = []
        groups: dict[bytes, str] = {}
        carried: list[Carried] = []
        pack = PENDING_HEADER.pack
        lookup, fresh = self.files.lookup, self.fresh_key
        for item_id, lease, deadline, reason in moves:
            found = lookup(lease.key, lease.source)
            if found is None:
                log.error("queue %s: value of item %d not found; left pending", self.name, item_id)
                continue
            deadline, key = fresh(deadline, item_id, None)
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
            carry(self.meta, self.reasons_of, item_id, deadline, reason, meta, carried)
            outcomes.append(ItemOutcome(item_id, deadline=deadline))
        if not parts:
            return None
        return Moves(b"".join(parts), pend, tombs, b"".join(meta), groups, carried)

    def batch(
        self, built: Moves, result: Any, restore: list[tuple[int, Lease]]
    ) -> tuple[PendingBatch, Carrying]:
        """The batch that submits the record ``built`` (``moves``): its new entries,
        its tombstones behind the cursor, the leases it ends (``restore``: given back if
        it is refused) and its smallest new key a barrier until it is published; memory
        says what it carries from now on (``note_carried``), and the ``Carrying`` returned
        gives that back if the record is refused."""
        pend = built.pend
        token = self.commit.hold(min(k for k, _, _ in pend))
        batch = PendingBatch(
            self.files.memseg,
            result,
            entries=pend,
            behind=len(built.tombs),
            token=token,
            restore=restore,
            wakes=True,
            groups=built.groups or None,
        )
        return batch, self.note_carried(built.carried, batch)

    def note_carried(self, carried: list[Carried], batch: PendingBatch) -> Carrying:
        """Memory says what ``batch``'s record carries from now on (it goes into the
        current log); keys it moves wait for its publication (``remembered``)."""
        log_no = self.commit.wal.segment_no
        carrying, moving = Carrying.apply(self.meta, carried, log_no, batch.future)
        if moving:
            batch.remembered = (batch.remembered or []) + moving
        return carrying
