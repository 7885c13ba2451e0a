"""What an item carries from one pending entry to the next: the key that names it and
its reasons (why it failed), and the deadline a retry policy gives a failed item.

Invariant: every record that writes a new pending entry for an item that a key names,
or that has reasons, carries a key entry and an error entry naming the new deadline
(``storage/itemmeta.py``), so the newest entries of an id always say where the item is
— after a restart, on a follower, in a backup — and the in-memory ``Remembered`` and
``ErrorNote`` say the same from the moment the record is appended (a record refused
before it is written gives the old ones back: ``Carrying.give_back``).

``MoveFrames`` calls these as it frames a move (``storage/move_frames.py``) and
``Queue`` as it submits it (``Queue._write_moves``); nothing here knows the queue.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dq.storage._leases import Lease
from dq.storage.itemmeta import ItemMeta, Remembered, encode_key_entry
from dq.storage.reasons import ErrorNote, Reason, encode_error_entry, with_reason
from dq.storage.types import QueueConfig

__all__ = ["Carried", "Carrying", "carry", "retry_deadline"]


def retry_deadline(config: QueueConfig, lease: Lease, now: int) -> int:
    """The next deadline of a leased item that failed or whose lease ran out: now + the
    policy's delay for the delivery that failed; now without a policy, and for an item
    that has had its ``max_deliveries`` (it moves to the dead-letter queue at the next
    dequeue, with no wait for a retry it will not get)."""
    policy = config.retry
    limit = config.max_deliveries
    if policy is None or (limit is not None and lease.dequeue_count >= limit):
        return now
    return now + policy.delay_ms(lease.dequeue_count)


@dataclass(slots=True)
class Carried:
    """What one moved item carries to its new deadline: the key entry that names it
    (None: no key does) and its reasons (None: it has none)."""

    item_id: int
    deadline: int
    key: Remembered | None
    reasons: tuple[Reason, ...] | None


def carry(
    meta: ItemMeta,
    reasons_of: Callable[[int], tuple[Reason, ...] | None],
    item_id: int,
    deadline: int,
    reason: Reason | None,
    parts: list[bytes],
    carried: list[Carried],
) -> None:
    """Add to ``parts`` (the record's metadata) what a record placing ``item_id`` at
    ``deadline`` carries — the key that names it, its reasons with ``reason`` added —
    and to ``carried`` what memory is to say once it is appended."""
    named = meta.key_naming(item_id)
    old = reasons_of(item_id)
    reasons = with_reason(old or (), reason) if reason is not None else old
    if named is None and reasons is None:
        return
    entry = None
    if named is not None:
        key, entry = named
        parts.append(encode_key_entry(item_id, deadline, entry.time, key.encode()))
    if reasons is not None:
        parts.append(encode_error_entry(item_id, deadline, reasons))
    carried.append(Carried(item_id, deadline, entry, reasons))


@dataclass(slots=True)
class Carrying:
    """Memory made to say what a record carries, and what it said before (to give it
    back if the record is refused)."""

    meta: ItemMeta
    before: list[tuple[Carried, int, ErrorNote | None]]

    @classmethod
    def apply(
        cls, meta: ItemMeta, carried: list[Carried], log_no: int, written: Future[Any]
    ) -> tuple[Carrying, list[Remembered]]:
        """Make ``meta`` say what ``carried`` says, as written in log ``log_no`` by the
        write ``written`` (keys it moves wait for it: a look-up by key meanwhile knows
        the item is in flight); returns the undo and the keys that wait."""
        errors = meta.errors
        before: list[tuple[Carried, int, ErrorNote | None]] = []
        moving: list[Remembered] = []
        for c in carried:
            before.append(
                (c, c.key.deadline if c.key is not None else 0, errors.notes.get(c.item_id))
            )
            if c.key is not None:
                c.key.deadline = c.deadline
                c.key.pending = written
                moving.append(c.key)
            if c.reasons is not None:
                errors.written(c.item_id, c.deadline, log_no, c.reasons)
        return cls(meta, before), moving

    def give_back(self) -> None:
        """The record was refused before it was written: memory says what it said."""
        errors = self.meta.errors
        for c, deadline, note in self.before:
            if c.key is not None:
                c.key.deadline, c.key.pending = deadline, None
            if c.reasons is not None:
                errors.put_back(c.item_id, note)
