"""Exact counts of a segment file's entries at or below a key, for a queue's stats.

A queue's due and delayed counts are, per source, the entries on either side of two
keys (the dequeue cursor and now). A segment file is sorted by key and its block
index gives each block's first key and entry count, so the entries below a key are
one binary search in the index plus one block decoded. Two things make that cheap
enough for stats read every second by the dashboard, ``/metrics`` and the telemetry
ring, and exact:

- **Tombstones.** The index counts entries, not which are tombstones (a tombstone in
  one file cancels a pending entry in another). Each block's tombstone count is
  learned once, the first time a count needs it, and kept for the life of the
  reader: a block is decoded for that at most once. The footer settles a file
  without tombstones (most merge outputs) or without pending entries at no cost, and
  a count decodes the blocks on whichever side of its key fewer are unknown.
- **Remembered boundaries.** A count found for a key holds for every key up to the
  file's next key, so each answer is kept with the range it holds for (a few per
  reader): while now has not reached the next deadline in this file, and the cursor
  has not moved past another of its entries, a count costs two comparisons. The last
  three decoded boundary blocks are kept as their keys, so a boundary moving within a
  block is a bisect.

Nothing here changes the file or its format: it reads blocks as ``SegmentReader`` does.
A block that fails its checksum does not fail the stats (every queue's listing and
``/metrics`` read them): the count falls back to whole blocks for that file, and the
damage is logged once, naming the file (``dq verify`` finds it too).
"""

from __future__ import annotations

import bisect
import logging
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
    segment file. Used under the queue's lock, like the reader itself."""

    __slots__ = (
        "_after",
        "_before",
        "_blocks",
        "_entries_before",
        "_memo",
        "_reader",
        "_tombs",
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

    def net_upto(self, key: bytes) -> int:
        """Pending entries minus tombstones whose key is at or below ``key``."""
        reader = self._reader
        first = reader.first_keys
        if not first or key < first[0]:
            return 0
        if key >= reader.info.last_key:
            return self.net_total
        memo = self._memo
        for i, (lo, hi, net) in enumerate(memo):
            if lo <= key and (hi is None or key < hi):
                if i:  # most recently used first: the cursor's and the oldest due's stay
                    memo.insert(0, memo.pop(i))
                return net
        if self.damaged is not None:
            return self._entries_before[reader.block_for(key)]
        try:
            lo, hi, net = self._count(key)
        except CorruptionError as exc:
            self.damaged = exc
            log.error(
                "stats count segment file %s to within a block from now on: %s", reader.path, exc
            )
            return self._entries_before[reader.block_for(key)]
        memo.insert(0, (lo, hi, net))
        del memo[_MEMO:]
        return net

    def _count(self, key: bytes) -> tuple[bytes, bytes | None, int]:
        reader = self._reader
        b = reader.block_for(key)
        keys, tombs = self._block(b)
        i = bisect.bisect_right(keys, key)  # >= 1: key >= the block's first key
        entries = self._entries_before[b] + i
        tombstones = self._tombstones_before(b) + tombs[i]
        if i < len(keys):
            hi: bytes | None = keys[i]
        else:
            hi = reader.first_keys[b + 1] if b + 1 < len(reader.first_keys) else None
        return keys[i - 1], hi, entries - 2 * tombstones

    def _block(self, b: int) -> tuple[list[bytes], list[int]]:
        """Block ``b``'s keys and running tombstone counts (its count learned too)."""
        cached = self._blocks.pop(b, None)
        if cached is None:
            reader = self._reader
            cached = _walk(reader.read_raw(b), reader.path, b)
            if len(cached[0]) != reader.block_entries[b]:
                raise CorruptionError(
                    "segment block holds another number of entries than its index says",
                    file=reader.path,
                    block=b,
                )
            self._tombs[b] = cached[1][-1]
        blocks = self._blocks
        blocks[b] = cached  # most recently used last
        while len(blocks) > _BLOCKS:
            del blocks[next(iter(blocks))]
        return cached

    def _tombstones_of(self, b: int) -> int:
        known = self._tombs[b]
        if known is None:
            reader = self._reader
            known = self._tombs[b] = _count_tombstones(reader.read_raw(b), reader.path, b)
        return known

    def _tombstones_before(self, b: int) -> int:
        """Tombstones in the blocks before ``b`` (whose own count is known).

        Sums are kept over the run of blocks learned from the file's start and the run
        learned from its end, so a boundary inside either is O(1); otherwise the blocks
        between the runs on the side with fewer of them are learned first.
        """
        total = self._reader.info.tombstone_count
        if total == 0:
            return 0
        tombs, n = self._tombs, len(self._tombs)
        before, after = self._before, self._after
        while len(before) <= n and tombs[len(before) - 1] is not None:
            before.append(before[-1] + tombs[len(before) - 1])  # type: ignore[operator]
        if b < len(before):
            return before[b]
        while len(after) <= n and tombs[n - len(after)] is not None:
            after.append(after[-1] + tombs[n - len(after)])  # type: ignore[operator]
        own = tombs[b]
        assert own is not None
        if n - b - 1 < len(after):
            return total - own - after[n - b - 1]
        left = range(len(before) - 1, b)
        right = range(b + 1, n - len(after) + 1)
        for j in left if len(left) <= len(right) else right:
            self._tombstones_of(j)
        return self._tombstones_before(b)
