"""Idempotent enqueue: items with a key are written once per key within the queue's
``dedup_window_ms``.

The key travels in the same log record as its item (``storage/itemmeta.py``), so it is
exactly as durable as the item. A repeat answers the first item's id and deadline
(``duplicate: true``) and writes nothing; if the first item is not durable yet, the
repeat's answer waits for it, so a repeat is never answered for an item that a crash
could still take back. A batch may mix new keys, repeated keys and items without keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.storage.codec import PENDING_HEADER
from dq.storage.futures import after_all
from dq.storage.itemmeta import Remembered, encode_group_entry, encode_key_entry
from dq.storage.types import Enqueued

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["enqueue_keyed"]


def enqueue_keyed(
    q: Queue,
    prepared: Sequence[tuple[int, bytes]],
    st: bytes,
    keys: Sequence[str | None],
    now: int,
    window: int,
    extra_meta: bytes = b"",
    groups: Sequence[str | None] | None = None,
) -> Future[list[Enqueued]]:
    """An enqueue where some items carry keys (under the lock): a key seen within the
    window answers the first item's id and deadline and writes nothing; the answer
    waits until that first item is durable, so a repeat is never answered for an
    item a crash could take back."""
    meta = q.meta
    results: list[Enqueued | None] = [None] * len(prepared)
    waits: list[Future[Any]] = []
    fresh: list[int] = []
    seen: dict[str, Remembered] = {}
    repeats: list[tuple[int, Remembered]] = []  # repeats of a key new in this batch
    for i, k in enumerate(keys):
        if k is not None and k in seen:
            repeats.append((i, seen[k]))
            continue
        known = None if k is None else meta.lookup(k, now, window)
        if known is not None:
            results[i] = Enqueued(known.id, known.deadline, duplicate=True)
            if known.pending is not None:
                waits.append(known.pending)
        else:
            fresh.append(i)
            if k is not None:
                seen[k] = Remembered(0, 0, now)  # id and deadline filled in below
    mine: Future[list[Enqueued]] | None = None
    if fresh:
        pack = PENDING_HEADER.pack
        first = q.next_id
        q.next_id += len(fresh)
        parts: list[bytes] = []
        keyed: list[tuple[bytes, bytes]] = []
        entries_meta: list[bytes] = []
        new_keys: list[str] = []
        new_entries: list[Remembered] = []
        new_groups: dict[bytes, str] = {}
        for n, i in enumerate(fresh):
            item_id = first + n
            deadline, key = q._place(prepared[i][0], item_id)
            value = prepared[i][1]
            parts.append(pack(key, st, len(value)))
            parts.append(value)
            keyed.append((key, value))
            results[i] = Enqueued(item_id, deadline)
            group = None if groups is None else groups[i]
            if group is not None:
                entries_meta.append(encode_group_entry(item_id, group))
                new_groups[key] = group
            k = keys[i]
            if k is not None:
                entry = seen[k]
                entry.id, entry.deadline = item_id, deadline
                entries_meta.append(encode_key_entry(item_id, deadline, now, k.encode()))
                meta.remember(k, entry)
                new_keys.append(k)
                new_entries.append(entry)
        q.rates.add("enqueue", len(fresh), now)
        token = q.hold(min(k for k, _ in keyed))
        mem = q.memseg

        def publish() -> None:
            for key, value in keyed:
                mem.add(key, st, value, new_groups.get(key))
            for entry in new_entries:  # committed: a repeat is answered at once
                entry.pending = None
            del q._unpublished[token]
            q.notify()

        def rollback() -> None:
            q._unpublished.pop(token, None)

        try:
            mine = q._submit(
                b"".join(parts), publish, None, rollback, b"".join(entries_meta) + extra_meta
            )
        except BaseException:
            for k, entry in zip(new_keys, new_entries, strict=True):
                if meta.keys.get(k) is entry:
                    del meta.keys[k]
            raise
        for entry in new_entries:
            entry.pending = mine
        mine.add_done_callback(lambda f: meta.settled(new_keys, new_entries, f))
        q.engine.emit("enqueued", q.name, [first + n for n in range(len(fresh))])
    for i, entry in repeats:
        results[i] = Enqueued(entry.id, entry.deadline, duplicate=True)
    answer = [r for r in results if r is not None]
    return after_all([mine, *waits] if mine is not None else waits, answer)
