"""Idempotent enqueue: items with a key are written once per key within the queue's
``dedup_window_ms``.

The key travels in the same log record as its item (``storage/itemmeta.py``), so it is
exactly as durable as the item. A repeat answers the first item's id and deadline
(``duplicate: true``) and writes nothing; if the first item is not durable yet, the
repeat's answer waits for it, so a repeat is never answered for an item that a crash
could still take back. A batch may mix new keys, repeated keys and items without keys.

An item with ``on_duplicate`` "replace" whose key names a pending item gives that item
its value and deadline instead (``KeyedBatch.rekeys``: one item, never two; debounce); if
that item is leased or gone, it is written as a new item and the key names it from then
on. Within a batch, a later "replace" of a key wins over the earlier item of that key.

This module decides, over the queue's ``ItemMeta``, which items of a batch are written
(``KeyedBatch.fresh``), which move an item by key (``rekeys``), and what the batch
answers; the queue writes them in one record (``Queue._write_pending``), under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from dq.storage.futures import after_all
from dq.storage.itemmeta import ItemMeta, Remembered, encode_key_entry
from dq.storage.key_moves import KeyState, Rekey
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
    #: pending items whose keys this batch repeats with "replace": they move
    rekeys: list[Rekey] = field(default_factory=list)
    #: fresh position -> the later item of the batch whose value and deadline it takes
    #: (a "replace" of a key new in this batch)
    substitute: dict[int, int] = field(default_factory=dict)
    #: positions of repeats within the batch that replaced (answered ``replaced``)
    replacing: set[int] = field(default_factory=set)

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
                meta.forget_key(k)

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
        replacing = self.replacing
        for i, entry in self.repeats:
            if i in replacing:
                results[i] = Enqueued(entry.id, entry.deadline, replaced=True)
            else:
                results[i] = Enqueued(entry.id, entry.deadline, duplicate=True)
        answer = [r for r in results if r is not None]
        mine = self.written
        return after_all([mine, *self.waits] if mine is not None else self.waits, answer)


def split_keyed(
    meta: ItemMeta,
    keys: Sequence[str | None],
    now: int,
    window: int,
    replace: Sequence[bool] | None = None,
    state_of: Callable[[Remembered], KeyState] | None = None,
    prepared: Sequence[tuple[int, bytes]] = (),
) -> KeyedBatch:
    """Sort a batch's items (call under the queue lock): a key seen within the window
    answers the first item's id and deadline and writes nothing — unless the item says
    "replace" (``replace[i]``) and the key's item is pending (``state_of``): then that
    item moves to this one's deadline and value (``prepared[i]``); the rest is fresh."""
    batch = KeyedBatch(keys, now, [None] * len(keys))
    results, seen = batch.results, batch.seen
    fresh_at: dict[str, int] = {}  # key new in this batch -> its fresh position
    rekey_of: dict[str, Rekey] = {}  # key whose pending item this batch moves
    for i, k in enumerate(keys):
        again = replace is not None and replace[i]
        if k is not None and k in seen:
            batch.repeats.append((i, seen[k]))
            if again:  # the later value and deadline win
                batch.replacing.add(i)
                if k in rekey_of:
                    r = rekey_of[k]
                    r.deadline, r.value, r.source = prepared[i][0], prepared[i][1], i
                else:
                    batch.substitute[fresh_at[k]] = i
            continue
        known = None if k is None else meta.lookup(k, now, window)
        if known is not None and again:
            assert state_of is not None and k is not None
            state = state_of(known)
            if state.kind == "pending":
                r = Rekey(k, known, state, prepared[i][0], prepared[i][1], index=i, source=i)
                batch.rekeys.append(r)
                rekey_of[k] = r
                seen[k] = known
                continue
            known = None  # leased or gone: a new item, which the key names from now on
        if known is not None:
            results[i] = Enqueued(known.id, known.deadline, duplicate=True)
            if known.pending is not None:
                batch.waits.append(known.pending)
        else:
            batch.fresh.append(i)
            if k is not None:
                seen[k] = Remembered(0, 0, now)  # id and deadline filled in by ``remember``
                fresh_at[k] = i
    return batch
