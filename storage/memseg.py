"""The in-memory segment: the sorted, mutable mirror of the current write-ahead log.

Entries are published here only after their log record is durable (per the fsync
mode). Keys are kept in a ``SortedList`` of encoded ``EntryKey`` bytes, so byte order
is key order and a forward scan is a bisect. Tombstones are kept too: they are what
the frozen segment file will carry to cancel entries in older segments.
"""

from __future__ import annotations

from sortedcontainers import SortedList

from dq.storage.codec import TOMBSTONE

__all__ = ["ENTRY_MEMORY", "MemSegment"]

#: bytes of Python memory one pending entry costs here beyond its value's length: the
#: key and value objects, the (stats, value) tuple, the dict slot and the sorted-list
#: slot (measured with tracemalloc by ``bench/memory.py``: ~200 on CPython 3.11)
ENTRY_MEMORY = 200


class MemSegment:
    __slots__ = (
        "_after",
        "_head",
        "_seen",
        "_version",
        "bytes",
        "entries",
        "groups",
        "keys",
        "pending_count",
        "replaced_by",
        "segment_no",
        "tombs",
        "tombstone_count",
    )

    def __init__(self, segment_no: int) -> None:
        self.segment_no = segment_no
        self.keys: SortedList = SortedList()
        self.tombs: SortedList = SortedList()
        #: key -> (stats, value) for pending entries, None for tombstones
        self.entries: dict[bytes, tuple[bytes, bytes] | None] = {}
        #: key -> group of the grouped pending entries (``docs/delivery.md``); freezing
        #: writes them into the segment file's group column
        self.groups: dict[bytes, str] = {}
        self.pending_count = 0
        self.tombstone_count = 0
        #: estimated bytes of memory the entries take (``ENTRY_MEMORY`` + value each)
        self.bytes = 0
        #: the segment file this memseg was frozen into (a hint for value lookups)
        self.replaced_by: object | None = None
        # next_after() is asked the same question several times per dequeued item
        self._version = 0
        self._seen = -1
        self._after = b""
        self._head: bytes | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def add_tombstone_behind(self, key: bytes) -> None:
        """Count a tombstone written at run time; do not keep it.

        Such a tombstone always cancels an entry that was delivered, so its key is at
        or behind the cursor and the forward view never needs it; the segment file
        made from the log carries it. Keeping it would cost ~120 bytes of memory per
        release for nothing. (A log reloaded after a restart adds its tombstones with
        ``add``, in order: then the view does need them.)
        """
        self.tombstone_count += 1

    def add_tombstones_behind(self, n: int) -> None:
        """``add_tombstone_behind`` of ``n`` tombstones at once."""
        self.tombstone_count += n

    def add(
        self, key: bytes, stats: bytes | None, value: bytes | None, group: str | None = None
    ) -> None:
        entries = self.entries
        if key in entries:
            return  # replaying the same record twice is harmless
        if group is not None:
            self.groups[key] = group
        if key[15] & 0b11 == TOMBSTONE:
            entries[key] = None
            self.tombs.add(key)
            self.tombstone_count += 1
            self.bytes += ENTRY_MEMORY
        else:
            assert stats is not None and value is not None
            entries[key] = (stats, value)
            self.pending_count += 1
            self.bytes += ENTRY_MEMORY + len(value)
        self.keys.add(key)
        self._version += 1

    def add_pending(
        self,
        entries: list[tuple[bytes, bytes]],
        stats: bytes,
        groups: list[str | None] | None = None,
    ) -> None:
        """``add`` of a written batch's pending entries (key, value), all with ``stats``
        (and ``groups``, one per entry, if any is grouped): one call for the batch on
        the path that publishes every write."""
        if groups is not None:
            known_groups = self.groups
            for (key, _v), group in zip(entries, groups, strict=True):
                if group is not None and key not in self.entries:
                    known_groups[key] = group
        known = self.entries
        add_key = self.keys.add
        added = size = 0
        for key, value in entries:
            if key in known:
                continue  # replaying the same record twice is harmless
            known[key] = (stats, value)
            add_key(key)
            added += 1
            size += len(value)
        if added:
            self.pending_count += added
            self.bytes += ENTRY_MEMORY * added + size
            self._version += 1

    def next_after(self, after: bytes) -> bytes | None:
        if self._seen == self._version and after == self._after:
            return self._head
        keys = self.keys
        i = keys.bisect_right(after)
        head = keys[i] if i < len(keys) else None
        self._seen, self._after, self._head = self._version, after, head
        return head

    def net_upto(self, key: bytes) -> int:
        """Pending entries minus tombstones at or below ``key`` (for stats).

        Tombstones counted but not kept (``add_tombstone_behind``) cancel delivered
        entries, at or behind the queue's cursor: they count as below any key at or
        past the cursor's tombstone, the only keys stats asks about.
        """
        keys, tombs = self.keys, self.tombs
        behind = self.tombstone_count - len(tombs)
        return int(keys.bisect_right(key) - 2 * tombs.bisect_right(key) - behind)

    @property
    def net_total(self) -> int:
        """Pending entries minus tombstones, all of them."""
        return self.pending_count - self.tombstone_count
