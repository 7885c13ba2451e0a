"""Exact counts of a segment file's entries at or below a key, for a queue's stats.

A queue's due and delayed counts are, per source, the entries on either side of two
keys (the dequeue cursor and now). A segment file is sorted by key and its block
index gives each block's first key and entry count, so the entries below a key are
one binary search in the index plus one block decoded. Two things make that cheap
enough for stats read every second by the dashboard, ``/metrics`` and the telemetry
ring, and exact:

- **Tombstones.** The index counts entries, not which are tombstones (a tombstone in
  one file cancels a pending entry in another). Each block's tombstone count is
  learned once and kept for the life of the reader. The footer settles a file
  without tombstones (most merge outputs) or without pending entries at no cost;
  otherwise ``learn`` decodes every block whose count is unknown *without the queue's
  lock* (the file is immutable), before the count that needs them: at 500,000 items
  that is a few hundred blocks, at 10 million seconds of decoding, during which the
  queue's writes and reads would otherwise wait. A count that still meets an
  unknown block (a file installed since) decodes, under the lock, the blocks on
  whichever side of its key fewer are unknown.
- **Remembered boundaries.** A count found for a key holds for every key up to the
  file's next key, so each answer is kept with the range it holds for (a few per
  reader): while now has not reached the next deadline in this file, and the cursor
  has not moved past another of its entries, a count costs two comparisons. The last
  three decoded boundary blocks are kept as their keys, so a boundary moving within a
  block is a bisect.

Threads: ``net_upto`` runs under the queue's lock and reads blocks through the queue's
reader; ``learn`` runs without it and reads through a handle of its own
(``CountedFile.reopen``: a reader's descriptor and decompressor are only used under the
queue's lock). What both learn is kept under a small lock of these counts, which
``learn`` holds only to store what it decoded and answer its probes from it, never
while it reads or decodes a block.

Nothing here changes the file or its format: it reads blocks as ``SegmentReader`` does.
A block that fails its checksum does not fail the stats (every queue's listing and
``/metrics`` read them): the count falls back to whole blocks for that file, and the
damage is logged once, naming the file (``dq verify`` finds it too).
"""

from __future__ import annotations

import bisect
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from dq.storage.codec import KEY_SIZE, TOMBSTONE
from dq.storage.errors import CorruptionError

__all__ = ["CountedFile", "SegmentCounts"]


class _Footer(Protocol):
    @property
    def last_key(self) -> bytes: ...
    @property
    def pending_count(self) -> int: ...
    @property
    def tombstone_count(self) -> int: ...


class CountedFile(Protocol):
    """What the counts read of a segment file: a ``SegmentReader`` (which makes its
    counts, so this module names only what it reads of it)."""

    @property
    def path(self) -> str: ...
    @property
    def info(self) -> _Footer: ...
    @property
    def first_keys(self) -> list[bytes]: ...
    @property
    def block_entries(self) -> list[int]: ...
    def block_for(self, key: bytes) -> int: ...
    def read_raw(self, i: int) -> bytes: ...
    def reopen(self) -> CountedFile:
        """The same file through a new handle of its own (OSError if it is gone)."""
        ...

    def close(self) -> None: ...


log = logging.getLogger(__name__)

#: remembered (range, count) answers per reader: the cursor, now, and the two keys the
#: oldest-due search checks (``storage/state_counts.py``)
_MEMO = 4
#: decoded boundary blocks kept per reader (as keys, not values): now's, the cursor's and
#: the oldest due item's
_BLOCKS = 3


def _walk(raw: bytes, where: str, block: int) -> tuple[list[bytes], list[int]]:
    """The keys of one decoded block, and how many tombstones precede each position
    (``tombs[i]``: tombstones among the first ``i`` entries; ``len(keys) + 1`` long)."""
    keys: list[bytes] = []
    tombs = [0]
    t = 0
    pos, end = 0, len(raw)
    from_bytes = int.from_bytes
    while pos < end:
        if end - pos < KEY_SIZE:
            raise CorruptionError("truncated entry key", file=where, block=block, at=pos)
        keys.append(raw[pos : pos + KEY_SIZE])
        if raw[pos + 15] & 0b11 == TOMBSTONE:
            t += 1
            pos += KEY_SIZE
        else:
            pos += 36 + from_bytes(raw[pos + 32 : pos + 36], "big")
        tombs.append(t)
    if pos != end:
        raise CorruptionError("entry value runs past its block", file=where, block=block)
    return keys, tombs


def _count_tombstones(raw: bytes, where: str, block: int) -> int:
    """Tombstones in one decoded block (keys are not kept)."""
    t = 0
    pos, end = 0, len(raw)
    from_bytes = int.from_bytes
    while pos < end:
        if end - pos < KEY_SIZE:
            raise CorruptionError("truncated entry key", file=where, block=block, at=pos)
        if raw[pos + 15] & 0b11 == TOMBSTONE:
            t += 1
            pos += KEY_SIZE
        else:
            pos += 36 + from_bytes(raw[pos + 32 : pos + 36], "big")
    if pos != end:
        raise CorruptionError("entry value runs past its block", file=where, block=block)
    return t


class SegmentCounts:
    """``net_upto(key)``: pending entries minus tombstones at or below ``key`` in one
    segment file, asked under the queue's lock; ``learn`` beforehand, without it."""

    __slots__ = (
        "_after",
        "_before",
        "_blocks",
        "_entries_before",
        "_lock",
        "_memo",
        "_reader",
        "_tombs",
        "_unknown",
        "damaged",
        "net_total",
    )

    def __init__(self, reader: CountedFile) -> None:
        self._reader = reader
        info = reader.info
        before = [0]
        for n in reader.block_entries:
            before.append(before[-1] + n)
        #: entries in the blocks before block ``i``
        self._entries_before = before
        #: each block's tombstone count, None until learned
        self._tombs: list[int | None]
        if info.tombstone_count == 0:
            self._tombs = [0] * len(reader.block_entries)
        elif info.pending_count == 0:
            self._tombs = list(reader.block_entries)
        else:
            self._tombs = [None] * len(reader.block_entries)
        #: how many of ``_tombs`` are still None
        self._unknown = self._tombs.count(None)
        #: tombstones in the first i blocks, while all of them are known (``_before[i]``)
        self._before = [0]
        #: tombstones in the last i blocks, while all of them are known (``_after[i]``)
        self._after = [0]
        #: pending entries minus tombstones in the whole file
        self.net_total = info.pending_count - info.tombstone_count
        #: (lo, hi, net): net_upto(k) == net for lo <= k < hi (hi None: no end)
        self._memo: list[tuple[bytes, bytes | None, int]] = []
        #: block number -> (keys, tombstones before each position), newest last
        self._blocks: dict[int, tuple[list[bytes], list[int]]] = {}
        #: the damage met reading a block, if any: counts are to within a block since
        self.damaged: CorruptionError | None = None
        #: guards everything above that changes (``learn`` runs without the queue's lock)
        self._lock = threading.Lock()

    def net_upto(self, key: bytes) -> int:
        """Pending entries minus tombstones whose key is at or below ``key``; call under
        the queue's lock (blocks not learned yet are read through its reader)."""
        reader = self._reader
        first = reader.first_keys
        if not first or key < first[0]:
            return 0
        if key >= reader.info.last_key:
            return self.net_total
        with self._lock:
            net = self._remembered(key)
            if net is not None:
                return net
            if self.damaged is None:
                try:
                    return self._answer(key, reader.read_raw)
                except CorruptionError as exc:
                    self.damaged = exc
                    log.error(
                        "stats count segment file %s to within a block from now on: %s",
                        reader.path,
                        exc,
                    )
            return self._entries_before[reader.block_for(key)]

    def learn(self, probes: Sequence[bytes]) -> None:
        """Before a count at ``probes`` (the keys it asks first, ``StateCounter.probes``),
        decode what it would: the blocks whose tombstones it needs and are unknown, and
        the blocks the probes fall in, so that the count decodes nothing; call *without*
        the queue's lock. After the first count of a file whose blocks are all known
        this costs one look: a boundary moving on later is one block, read under the
        lock as before. A file gone meanwhile (merged away), or one that cannot be read,
        is left to the count, which logs damage once."""
        reader = self._reader
        first, last = reader.first_keys, reader.info.last_key
        inside = [k for k in probes if first and first[0] <= k < last]
        with self._lock:
            if self.damaged is not None or (self._memo and not self._unknown):
                return  # counted before, and every block known: a boundary is one block
            asked = [k for k in inside if self._remembered(k) is None]
            bounds = {reader.block_for(k) for k in asked}
            wanted: set[int] = set()
            for b in bounds:
                wanted.update(self._missing_for(b))
            wanted -= bounds
            if not asked or (self._memo and not wanted):
                return  # a boundary alone is one block: not worth a handle of its own
        try:
            copy = reader.reopen()
        except (OSError, CorruptionError):
            return
        try:
            if copy.info != reader.info or copy.block_entries != reader.block_entries:
                return  # another file by that name: nothing of it is this one's
            read = copy.read_raw
            for b in sorted(wanted):
                n = _count_tombstones(read(b), copy.path, b)  # no lock held
                with self._lock:
                    self._learned(b, n)
            for b in sorted(bounds):
                block = self._walk_block(b, read)  # no lock held
                with self._lock:
                    self._keep_block(b, block)
                    for key in asked:
                        if reader.block_for(key) == b and self._remembered(key) is None:
                            self._answer(key, read)
        except CorruptionError:
            return
        finally:
            copy.close()

    def _remembered(self, key: bytes) -> int | None:
        """The count at ``key`` if a remembered range holds it (under ``_lock``)."""
        memo = self._memo
        for i, (lo, hi, net) in enumerate(memo):
            if lo <= key and (hi is None or key < hi):
                if i:  # most recently used first: the cursor's and the oldest due's stay
                    memo.insert(0, memo.pop(i))
                return net
        return None

    def _answer(self, key: bytes, read: Callable[[int], bytes]) -> int:
        """Count at ``key`` (inside the file, not remembered) and remember the range it
        holds for; blocks still unknown are read with ``read`` (under ``_lock``)."""
        lo, hi, net = self._count(key, read)
        memo = self._memo
        memo.insert(0, (lo, hi, net))
        del memo[_MEMO:]
        return net

    def _count(self, key: bytes, read: Callable[[int], bytes]) -> tuple[bytes, bytes | None, int]:
        reader = self._reader
        b = reader.block_for(key)
        keys, tombs = self._block(b, read)
        i = bisect.bisect_right(keys, key)  # >= 1: key >= the block's first key
        entries = self._entries_before[b] + i
        tombstones = self._tombstones_before(b, read) + tombs[i]
        if i < len(keys):
            hi: bytes | None = keys[i]
        else:
            hi = reader.first_keys[b + 1] if b + 1 < len(reader.first_keys) else None
        return keys[i - 1], hi, entries - 2 * tombstones

    def _walk_block(self, b: int, read: Callable[[int], bytes]) -> tuple[list[bytes], list[int]]:
        """Decode block ``b``: its keys and running tombstone counts (no state changes)."""
        reader = self._reader
        walked = _walk(read(b), reader.path, b)
        if len(walked[0]) != reader.block_entries[b]:
            raise CorruptionError(
                "segment block holds another number of entries than its index says",
                file=reader.path,
                block=b,
            )
        return walked

    def _keep_block(self, b: int, block: tuple[list[bytes], list[int]]) -> None:
        """Keep a decoded boundary block (most recently used last) and its count."""
        self._learned(b, block[1][-1])
        blocks = self._blocks
        blocks.pop(b, None)
        blocks[b] = block
        while len(blocks) > _BLOCKS:
            del blocks[next(iter(blocks))]

    def _block(self, b: int, read: Callable[[int], bytes]) -> tuple[list[bytes], list[int]]:
        """Block ``b``'s keys and running tombstone counts (its count learned too)."""
        cached = self._blocks.get(b)
        if cached is None:
            cached = self._walk_block(b, read)
        self._keep_block(b, cached)
        return cached

    def _learned(self, b: int, tombstones: int) -> None:
        if self._tombs[b] is None:
            self._tombs[b] = tombstones
            self._unknown -= 1

    def _tombstones_of(self, b: int, read: Callable[[int], bytes]) -> int:
        known = self._tombs[b]
        if known is None:
            known = _count_tombstones(read(b), self._reader.path, b)
            self._learned(b, known)
        return known

    def _runs(self) -> tuple[list[int], list[int]]:
        """Tombstone sums over the run of known blocks from the file's start and the run
        from its end, extended over the blocks learned since."""
        tombs, n = self._tombs, len(self._tombs)
        before, after = self._before, self._after
        while len(before) <= n and tombs[len(before) - 1] is not None:
            before.append(before[-1] + tombs[len(before) - 1])  # type: ignore[operator]
        while len(after) <= n and tombs[n - len(after)] is not None:
            after.append(after[-1] + tombs[n - len(after)])  # type: ignore[operator]
        return before, after

    def _between(self, b: int) -> range:
        """The blocks ``_tombstones_before(b)`` learns: none if a run reaches ``b``, else
        those between ``b`` and the run on the side where fewer lie."""
        before, after = self._runs()
        n = len(self._tombs)
        if b < len(before) or n - b - 1 < len(after):
            return range(0)
        left = range(len(before) - 1, b)
        right = range(b + 1, n - len(after) + 1)
        return left if len(left) <= len(right) else right

    def _missing_for(self, b: int) -> list[int]:
        """The unknown blocks a count in block ``b`` decodes: ``b`` and those
        ``_tombstones_before(b)`` learns."""
        tombs = self._tombs
        return [j for j in (b, *self._between(b)) if tombs[j] is None]

    def _tombstones_before(self, b: int, read: Callable[[int], bytes]) -> int:
        """Tombstones in the blocks before ``b`` (whose own count is known).

        Sums are kept over the run of blocks learned from the file's start and the run
        learned from its end, so a boundary inside either is O(1); otherwise the blocks
        between the runs on the side with fewer of them are learned first.
        """
        total = self._reader.info.tombstone_count
        if total == 0:
            return 0
        before, after = self._runs()
        if b < len(before):
            return before[b]
        n = len(self._tombs)
        own = self._tombs[b]
        assert own is not None
        if n - b - 1 < len(after):
            return total - own - after[n - b - 1]
        for j in self._between(b):
            self._tombstones_of(j, read)
        return self._tombstones_before(b, read)
