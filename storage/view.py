"""The merged view that dequeue reads: every segment file and in-memory segment at once.

Sources are kept positioned strictly after the queue's cursor (the last dequeued
key). Segment files are immutable, so each has a persistent ``SegmentCursor`` in a
heap ordered by its next key; in-memory segments are mutable and are bisected from
the cursor on every look. A tombstone sorts right after its pending entry, so the
pair meets at the top of the view and is skipped there: no tombstone ever reaches a
consumer, and no lookup is needed to cancel one.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import bisect_left, bisect_right

from dq.storage.codec import TOMBSTONE, decode_stats, tombstone_of
from dq.storage.memseg import MemSegment
from dq.storage.segment import SegmentCursor, SegmentReader

__all__ = ["Hit", "MergedView", "Stretch"]

Source = SegmentCursor | MemSegment
#: (key, stats, value, where the entry lives, its item's group) of one live pending entry
Hit = tuple[bytes, bytes, bytes, object, str | None]


class Stretch:
    """Entries ``keys[pos:end]`` of one source that the view yields one after another
    (``MergedView.run``), their groups (``groups[i]``; None: no group for any), where
    they live, and the segment file's cursor that ``MergedView.step_to`` moves."""

    __slots__ = ("cursor", "end", "groups", "keys", "pos", "source")

    def __init__(
        self,
        keys: list[bytes],
        groups: list[str | None] | None,
        pos: int,
        source: SegmentReader | MemSegment,
        cursor: SegmentCursor | None,
    ) -> None:
        self.keys = keys
        self.groups = groups
        self.pos = pos
        self.end = pos
        self.source = source
        self.cursor = cursor

    def entry(self, i: int) -> tuple[bytes, bytes]:
        """(stats, value) of the entry at ``i``."""
        cur = self.cursor
        if cur is not None:
            assert cur.block is not None
            _k, stats, value = cur.block.entry(i)
            return stats, value
        source = self.source
        assert isinstance(source, MemSegment)
        found = source.entries[self.keys[i]]
        assert found is not None
        return found


class MergedView:
    def __init__(self) -> None:
        self.memsegs: list[MemSegment] = []
        self._heap: list[tuple[bytes, int, SegmentCursor]] = []
        self._tiebreak = itertools.count()
        self.cursors: dict[int, SegmentCursor] = {}  # id(reader) -> cursor

    def add_segment(self, reader: SegmentReader, after: bytes) -> None:
        cur = SegmentCursor(reader, after)
        self.cursors[id(reader)] = cur
        if cur.key is not None:
            heapq.heappush(self._heap, (cur.key, next(self._tiebreak), cur))

    def remove_segments(self, readers: list[SegmentReader]) -> None:
        gone = {id(r) for r in readers}
        for g in gone:
            self.cursors.pop(g, None)
        self._heap = [h for h in self._heap if id(h[2].reader) not in gone]
        heapq.heapify(self._heap)

    def peek(self, after: bytes) -> tuple[bytes, Source] | None:
        """Smallest key strictly after ``after`` and the source holding it."""
        best: bytes | None = None
        src: Source | None = None
        heap = self._heap
        while heap and heap[0][0] <= after:
            self.advance(heap[0][2])
        if heap:
            best, _, src = heap[0]
        for m in self.memsegs:
            k = m.next_after(after)
            if k is not None and (best is None or k < best):
                best, src = k, m
        if best is None or src is None:
            return None
        return best, src

    def advance(self, src: Source) -> None:
        """Step a segment cursor past its current key (memsegs need no step)."""
        if isinstance(src, SegmentCursor):
            src.advance()
            if src.key is None:
                heapq.heappop(self._heap)
            else:
                heapq.heapreplace(self._heap, (src.key, next(self._tiebreak), src))

    def run(self, after: bytes, limit: bytes, barrier: bytes | None, size: int) -> Stretch | None:
        """The entries after ``after`` that ``next_live`` would yield one by one from a
        single source, as one ``Stretch`` (at most ``size`` entries of an in-memory
        segment; of a segment file, the rest of its cursor's block); None when the next
        entry starts no such stretch (ask ``next_live``). Every entry in it is live:
        pending, its key's only copy, cancelled by no tombstone. So it ends before a
        tombstone or a second copy in its source and the entry ahead of it (a block's
        ``breaks``); before the last entry of a
        block or of ``size`` (that entry's tombstone may come next); where another
        source's next key could be a copy of an entry or its tombstone; and up to
        ``limit``, short of ``barrier``."""
        heap = self._heap
        while heap and heap[0][0] <= after:
            self.advance(heap[0][2])
        mem: MemSegment | None = None
        first: bytes | None = None  # the smallest next key of the in-memory segments
        second: bytes | None = None  # the next smallest, of another one
        for m in self.memsegs:
            k = m.next_after(after)
            if k is None:
                continue
            if first is None or k < first:
                if first is not None and (second is None or first < second):
                    second = first
                first, mem = k, m
            elif second is None or k < second:
                second = k
        if heap and (first is None or heap[0][0] < first):
            cur = heap[0][2]
            block = cur.block
            assert block is not None
            keys = block.keys
            pos = cur.pos
            end = len(keys) - 1
            other = first
            for h in heap[1:3]:
                if other is None or h[0] < other:
                    other = h[0]
            breaks = block.breaks
            if breaks:
                t = bisect_left(breaks, pos)
                if t < len(breaks):
                    end = min(end, breaks[t] - 1)
            if end <= pos:
                return None
            stretch = Stretch(keys, block.groups, pos, cur.reader, cur)
        elif mem is not None and first is not None and (not heap or first < heap[0][0]):
            other = heap[0][0] if heap else None
            if second is not None and (other is None or second < other):
                other = second
            keys = list(itertools.islice(mem.keys.irange(after, other, (False, False)), size))
            end = len(keys) - 1 if len(keys) == size else len(keys)
            if mem.tombstone_count:
                for t, k in enumerate(keys):
                    if k[15] & 0b11 == TOMBSTONE:
                        end = min(end, t - 1)
                        break
            pos = 0
            if end <= pos:
                return None
            stretch = Stretch(
                keys, mem.groups_of(keys[:end]) if mem.grouped else None, 0, mem, None
            )
        else:
            return None
        end = bisect_right(keys, limit, pos, end)
        if barrier is not None:
            end = bisect_left(keys, barrier, pos, end)
        if other is not None:
            end = bisect_left(keys, other, pos, end)
            if end > pos and tombstone_of(keys[end - 1]) >= other:
                end -= 1
        if end <= pos:
            return None
        stretch.end = end
        return stretch

    def step_to(self, stretch: Stretch, pos: int) -> None:
        """The entries of ``stretch`` (which ``run`` returned: nothing has read the
        view since) before ``pos`` are passed: move its source on."""
        cur = stretch.cursor
        if cur is None:  # an in-memory segment is bisected from the cursor
            return
        cur.seek(pos)
        if cur.key is None:
            heapq.heappop(self._heap)
        else:
            heapq.heapreplace(self._heap, (cur.key, next(self._tiebreak), cur))

    def skip_key(self, key: bytes) -> None:
        """Advance every segment cursor sitting exactly on ``key`` (duplicate tombstones)."""
        while self._heap and self._heap[0][0] == key:
            self.advance(self._heap[0][2])

    def _take(self, key: bytes, after: bytes) -> list[tuple[bytes, bytes, object, str | None]]:
        """Consume every copy of ``key`` (heads of any source); return pending payloads."""
        got: list[tuple[bytes, bytes, object, str | None]] = []
        pending = key[15] & 0b11 != TOMBSTONE
        heap = self._heap
        while heap and heap[0][0] == key:
            cur = heap[0][2]
            if pending:
                _k, stats, value = cur.entry()
                got.append((stats, value, cur.reader, cur.group()))
            else:
                got.append((b"", b"", None, None))
            self.advance(cur)
        for m in self.memsegs:
            if m.next_after(after) == key:
                entry = m.entries[key]
                got.append(
                    (entry[0], entry[1], m, m.group_of(key))
                    if entry is not None
                    else (b"", b"", None, None)
                )
        return got

    def next_live(
        self, after: bytes, limit: bytes, barrier: bytes | None
    ) -> tuple[bytes, Hit | None]:
        """Next live pending entry with after < key <= limit (and key < barrier).

        Returns the new cursor position and the hit (or None). Entries count as a
        multiset per (deadline, id): pendings +1, tombstones -1; a key is live when
        its pendings outnumber its tombstones. Lone tombstones are stepped over.
        """
        while True:
            top = self.peek(after)
            if top is None:
                return after, None
            key = top[0]
            if key > limit or (barrier is not None and key >= barrier):
                return after, None
            if key[15] & 0b11 == TOMBSTONE:
                self._take(key, after)
                after = key
                continue
            copies = self._take(key, after)
            tomb = tombstone_of(key)
            nxt = self.peek(key)
            tombs = len(self._take(tomb, key)) if nxt is not None and nxt[0] == tomb else 0
            after = tomb if tombs else key
            if len(copies) > tombs:
                if len(copies) == 1:
                    stats, value, source, group = copies[0]
                else:  # the same key from two server lifetimes: the newest stats win
                    stats, value, source, group = max(copies, key=lambda c: decode_stats(c[0])[1])
                return after, (key, stats, value, source, group)
