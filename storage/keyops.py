"""Items addressed by key: look at, cancel, reschedule or replace the item a key names.

A mixin of ``Engine`` (``storage/engine.py``), as the operator's calls are
(``storage/operations.py``). An item's ``key`` (the idempotency key of its enqueue)
names it while the queue remembers the key — ``dedup_window_ms`` after the write that
last named it (its enqueue, an enqueue that replaced it, a move by key) — so each call
is one look-up of the item's entry (``Queue.key_state``): no search by id, whatever the
queue holds. Past the window the key names nothing (``KeyNotFound``); a queue that
should address items by key for longer keeps them longer (up to 7 days).

Rules, the same on every front end:

- a leased item is not changed by key (``ItemLeased``, 409): a consumer has it, and its
  receipt is what settles it; nothing is written;
- a gone item (released, deleted, purged, dead-lettered) cannot be cancelled or moved
  (``ItemNotFound``); a peek shows it as gone, with where it went if it was moved;
- a cancel by key frees the key (an enqueue with it then makes a new item); a move by
  key starts the key's window again and keeps the item's id, delivery count and reasons.

Every change is written (and, in a replica group, committed) before it is answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dq.storage.browse import Found, as_item, gone
from dq.storage.codec import MAX_DEADLINE, decode_stats, key_deadline
from dq.storage.errors import (
    InvalidArgument,
    ItemLeased,
    ItemNotFound,
    KeyNotFound,
    ValueTooLarge,
    WriteStall,
)
from dq.storage.itemmeta import Remembered, check_key
from dq.storage.key_moves import KeyState
from dq.storage.types import BrowsedItem, Enqueued, ItemStats
from dq.storage.validation import resolve_deadline

if TYPE_CHECKING:
    from dq.storage.config import EngineConfig
    from dq.storage.moved import MovedItems
    from dq.storage.queue import Queue

__all__ = ["KeyOps"]


class KeyOps:
    """The by-key calls of ``Engine``; see the module docstring."""

    if TYPE_CHECKING:
        config: EngineConfig
        now: Callable[[], int]
        moved: MovedItems

        def _queue(self, name: str) -> Queue: ...
        def _check_writable(self) -> None: ...

    def _named(self, q: Queue, key: str, now: int) -> Remembered:
        """The entry of ``key`` in queue ``q`` (under its lock), or ``KeyNotFound``."""
        window = q.config.dedup_window_ms
        entry = q.meta.lookup(key, now, window) if window > 0 else None
        if entry is None:
            if window == 0:
                why = "the queue keeps no keys (its dedup_window_ms is 0)"
            else:
                why = (
                    f"no item was enqueued with it in the last {window} ms (the queue's "
                    "dedup_window_ms), or its item was cancelled by key"
                )
            raise KeyNotFound(f"key {key!r} names no item of queue {q.name!r}: {why}", queue=q.name)
        return entry

    def peek_key(self, name: str, key: str, with_values: bool = True) -> BrowsedItem:
        """The item ``key`` names, wherever it is (state "gone" once it left the queue)."""
        check_key(key)
        q = self._queue(name)
        now = self.now()
        with q.lock:
            q.check_open()
            q.requeue_expired(now)
            entry = self._named(q, key, now)
            state = q.key_state(entry)
            if state.kind == "gone":
                return gone(q, entry.id, self.moved.lookup(name, entry.id))
            return as_item(q, _found(q, entry.id, state), now, with_values)

    def cancel_key(self, name: str, key: str) -> int:
        """Cancel the pending item ``key`` names; its id. The key is free again."""
        check_key(key)
        self._check_writable()
        q = self._queue(name)
        now = self.now()
        with q.lock:
            q.check_open()
            q.requeue_expired(now)
            entry = self._named(q, key, now)
            state = _pending(q, key, entry, q.key_state(entry))
            fut = q.cancel_by_key(key, entry, state)
        item_id: int = fut.result(self.config.wait_timeout_s)
        return item_id

    def patch_key(
        self,
        name: str,
        key: str,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
        value: bytes | None = None,
    ) -> Enqueued:
        """Give the pending item ``key`` names a new deadline (``deadline`` or
        ``delay_ms``) and/or value; its id and the deadline it now has."""
        check_key(key)
        if deadline is None and delay_ms is None and value is None:
            raise InvalidArgument("give deadline or delay_ms, and/or value: nothing to change")
        if value is not None:
            if not isinstance(value, bytes | bytearray | memoryview):
                raise InvalidArgument("value must be bytes")
            limit = self.config.max_value_bytes
            if len(value) > limit:
                raise ValueTooLarge(
                    f"value is {len(value)} bytes; the limit is {limit}", limit=limit
                )
            value = bytes(value)
        self._check_writable()
        q = self._queue(name)
        give_up = time.monotonic() + self.config.wait_timeout_s
        while True:
            now = self.now()
            when = (
                None
                if deadline is None and delay_ms is None
                else resolve_deadline(deadline, delay_ms, now)
            )
            with q.lock:
                q.check_open()
                try:
                    q.jobs.refuse_if_stalled()  # the stall rule every record obeys
                except WriteStall:
                    if time.monotonic() > give_up:
                        raise
                else:
                    q.requeue_expired(now)
                    entry = self._named(q, key, now)
                    state = _pending(q, key, entry, q.key_state(entry))
                    target = key_deadline(state.pkey) if when is None else when
                    fut, done = q.rekey(
                        key,
                        entry,
                        state,
                        min(target, MAX_DEADLINE),
                        state.value if value is None else value,
                        now,
                    )
                    break
            time.sleep(0.005)  # writes stalled while segment files are written: wait it out
        fut.result(self.config.wait_timeout_s)
        return done


def _pending(q: Queue, key: str, entry: Remembered, state: KeyState) -> KeyState:
    """``state`` if the item is pending; else why it cannot be changed by key."""
    if state.kind == "leased":
        raise ItemLeased(
            f"item {entry.id} (key {key!r}) is leased: a consumer has it; it is not changed "
            "by key — release, requeue or fail it with its receipt, or try again later",
            queue=q.name,
            id=entry.id,
        )
    if state.kind == "gone":
        raise ItemNotFound(
            f"item {entry.id} (key {key!r}) is no longer in queue {q.name!r} (released, "
            "deleted, purged or dead-lettered)",
            queue=q.name,
            id=entry.id,
        )
    return state


def _found(q: Queue, item_id: int, state: KeyState) -> Found:
    """``state`` (pending or leased) as browse shows an item."""
    lease = state.lease
    if lease is not None:
        value = q.files.lookup(lease.key, lease.source)
        stats = ItemStats(lease.enqueue_time, lease.requeue_time, lease.dequeue_count)
        return Found(item_id, lease.key, stats, None if value is None else value[1], lease)
    enq, req, cnt = decode_stats(state.stats)
    return Found(item_id, state.pkey, ItemStats(enq, req, cnt), state.value, None)
