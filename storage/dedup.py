"""Idempotent enqueue: items with a key are written once per key within the queue's
``dedup_window_ms``.

The key travels in the same log record as its item (``storage/itemmeta.py``), so it is
exactly as durable as the item. A repeat answers the first item's id and deadline
(``duplicate: true``) and writes nothing; if the first item is not durable yet, the
repeat's answer waits for it, so a repeat is never answered for an item that a crash
could still take back. A batch may mix new keys, repeated keys and items without keys.

This module decides, over the queue's ``ItemMeta``, which items of a batch are written
(``KeyedBatch.fresh``) and what the batch answers; the queue writes the fresh items
like any enqueue (``Queue._write_pending``), under its lock.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dq.storage.futures import after_all
from dq.storage.itemmeta import ItemMeta, Remembered, encode_key_entry
from dq.storage.types import Enqueued

__all__ = ["KeyedBatch", "split_keyed"]


@dataclass(slots=True)
class KeyedBatch:
    """One enqueue whose items carry idempotency keys, from ``split_keyed`` to ``answer``."""

    keys: Sequence[str | None]
    now: int
    #: the answer per item of the batch, filled in as it is known
    results: list[Enqueued | None]
    #: positions of the items to write (a new key, or no key)
    fresh: list[int] = field(default_factory=list)
    #: futures of earlier writes of repeated keys not durable yet: the answer waits
    waits: list[Future[Any]] = field(default_factory=list)
    #: keys new in this batch, and repeats of them within it
    seen: dict[str, Remembered] = field(default_factory=dict)
    repeats: list[tuple[int, Remembered]] = field(default_factory=list)
    new_keys: list[str] = field(default_factory=list)
    new_entries: list[Remembered] = field(default_factory=list)
    #: the write of the fresh items (None: nothing to write)
    written: Future[Any] | None = None

    def remember(self, meta: ItemMeta, enqueued: list[Enqueued]) -> list[bytes]:
        """The fresh items got ids and deadlines (``enqueued``, in ``fresh`` order):
        remember their keys and return the metadata entries their record carries."""
        results, keys, seen = self.results, self.keys, self.seen
        entries: list[bytes] = []
        for i, done in zip(self.fresh, enqueued, strict=True):
            results[i] = done
            k = keys[i]
            if k is not None:
                entry = seen[k]
                entry.id, entry.deadline = done.id, done.deadline
                entries.append(encode_key_entry(done.id, done.deadline, self.now, k.encode()))
                meta.remember(k, entry)
                self.new_keys.append(k)
                self.new_entries.append(entry)
        return entries

    def refused(self, meta: ItemMeta) -> None:
        """The write was refused before anything was written: forget its new keys."""
        for k, entry in zip(self.new_keys, self.new_entries, strict=True):
            if meta.keys.get(k) is entry:
                del meta.keys[k]

    def submitted(self, meta: ItemMeta, fut: Future[Any]) -> None:
        """The fresh items' record is on its way: repeats wait for ``fut`` until it is
        durable (its publication clears the wait), and its outcome settles the keys."""
        self.written = fut
        new_keys, new_entries = self.new_keys, self.new_entries
        for entry in new_entries:
            entry.pending = fut
        fut.add_done_callback(lambda f: meta.settled(new_keys, new_entries, f))

    def answer(self) -> Future[list[Enqueued]]:
        """The batch's answer, once its write and every earlier write it repeats are
        durable (or the first failure)."""
        results = self.results
        for i, entry in self.repeats:
            results[i] = Enqueued(entry.id, entry.deadline, duplicate=True)
        answer = [r for r in results if r is not None]
        mine = self.written
        return after_all([mine, *self.waits] if mine is not None else self.waits, answer)


def split_keyed(meta: ItemMeta, keys: Sequence[str | None], now: int, window: int) -> KeyedBatch:
    """Sort a batch's items (call under the queue lock): a key seen within the window
    answers the first item's id and deadline and writes nothing; the rest is fresh."""
    batch = KeyedBatch(keys, now, [None] * len(keys))
    results, seen = batch.results, batch.seen
    for i, k in enumerate(keys):
        if k is not None and k in seen:
            batch.repeats.append((i, seen[k]))
            continue
        known = None if k is None else meta.lookup(k, now, window)
        if known is not None:
            results[i] = Enqueued(known.id, known.deadline, duplicate=True)
            if known.pending is not None:
                batch.waits.append(known.pending)
        else:
            batch.fresh.append(i)
            if k is not None:
                seen[k] = Remembered(0, 0, now)  # id and deadline filled in by ``remember``
    return batch
