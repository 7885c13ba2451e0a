"""One group as the delivery index sees it (``storage/delivery.py``): its slots taken
(live leases) and the due items of it that dequeue's cursor has passed but not handed
out — held back by a rule, or waiting for the group's turn.

The held items are keys only (16 bytes each, ``docs/format.md``), packed in the order the
cursor passed them, which is key order: a held item's value and stats stay where its
entry lives (an in-memory segment or a segment file) and are read when it is handed
out. Most groups hold none or one (a group with a lease and its next item), so ``keys``
is the empty ``bytes`` until the first, that key's own ``bytes`` while it is the only
one, and a ``bytearray`` from the second on: a group costs no buffer of its own until
it holds two. ``front`` holds the items that came back after their
lease ran out (``docs/delivery.md``): they go before the group's other held items.

Invariant: ``keys[head:]`` is sorted and every key in it is a live pending entry at or
below the queue's cursor that no lease holds; so is every key in ``front``, which is
sorted too. ``keys`` is empty (and ``head`` 0) exactly when it holds no key, so a plain
truth test says whether the group holds any. A group with no lease, no held item and no item on its way back
(``returning``) is dropped by the index: an idle group costs nothing.
"""

from __future__ import annotations

__all__ = ["FRONT", "HELD", "KEY", "Group"]

#: bytes of one key (``docs/format.md``, "EntryKey")
KEY = 16
#: where ``Group.remove`` found a key: among the held items, or back from a lease
HELD = 1
FRONT = 2
#: the consumed front of ``keys`` is cut off once it is this long and half of it
_COMPACT = 64 * KEY


class Group:
    """A group's slots and held items; the index's to change (under the queue's lock)."""

    __slots__ = ("front", "head", "keys", "leased", "name", "queued", "returning")

    def __init__(self, name: str | None) -> None:
        self.name = name
        #: live leases of the group's items, and ends of leases not yet durable
        self.leased = 0
        self.keys: bytes | bytearray = b""
        #: where the first held key starts in ``keys``
        self.head = 0
        #: keys of items back from an expired lease, delivered before ``keys``
        self.front: list[bytes] | None = None
        #: items whose lease ran out, written back, not yet reached by the cursor: the
        #: group's other held items wait for them (they come first)
        self.returning = 0
        #: on the index's round-robin ring (``fair``)
        self.queued = False

    def __repr__(self) -> str:
        return f"Group({self.name!r}, leased={self.leased}, held={self.held})"

    @property
    def held(self) -> int:
        """Items held: passed by the cursor, not handed out."""
        return (len(self.keys) - self.head) // KEY + (len(self.front) if self.front else 0)

    @property
    def idle(self) -> bool:
        """Nothing to remember: no lease, no held item, nothing on its way back."""
        return not self.leased and not self.returning and not self.keys and not self.front

    def head_key(self) -> bytes | None:
        """The key this group hands out next, if it may hand one out in order: the
        first item back from a lease, else (none on its way back) the first held one."""
        if self.front:
            return self.front[0]
        if self.returning or self.head == len(self.keys):
            return None
        return bytes(self.keys[self.head : self.head + KEY])

    def first_key(self) -> bytes | None:
        """The smallest key held (for the age of the oldest due item)."""
        first = (
            bytes(self.keys[self.head : self.head + KEY]) if self.head < len(self.keys) else None
        )
        if self.front and (first is None or self.front[0] < first):
            return self.front[0]
        return first

    def pop_head(self) -> bytes:
        """Take the key ``head_key`` named."""
        if self.front:
            key = self.front.pop(0)
            if not self.front:
                self.front = None
            return key
        start = self.head
        keys = self.keys
        key = bytes(keys[start : start + KEY])
        start += KEY
        if start == len(keys):  # none left: the buffer goes
            self.keys = b""
            start = 0
        elif start >= _COMPACT and 2 * start >= len(keys):
            assert isinstance(keys, bytearray)
            del keys[:start]
            start = 0
        self.head = start
        return key

    def append(self, key: bytes) -> None:
        keys = self.keys
        if not keys:
            self.keys = bytes(key)  # the key's own object (``bytes`` of bytes is itself)
        elif isinstance(keys, bytearray):
            keys += key
        else:
            self._mutable().extend(key)

    def _mutable(self) -> bytearray:
        """``keys`` as a ``bytearray``, to change in place."""
        keys = self.keys
        if not isinstance(keys, bytearray):
            keys = self.keys = bytearray(keys)
        return keys

    def arrive(self, key: bytes) -> None:
        """An item back from an expired lease reached the cursor: it goes first."""
        self.returning -= 1
        if self.front is None:
            self.front = [key]
        else:
            self.front.append(key)

    def _find(self, key: bytes) -> int:
        """Offset of ``key`` in ``keys[head:]`` (binary search), or -1."""
        keys = self.keys
        lo, hi = 0, (len(keys) - self.head) // KEY
        base = self.head
        while lo < hi:
            mid = (lo + hi) // 2
            at = base + mid * KEY
            probe = keys[at : at + KEY]
            if probe < key:
                lo = mid + 1
            elif probe > key:
                hi = mid
            else:
                return at
        return -1

    def holds(self, key: bytes) -> bool:
        return (self.front is not None and key in self.front) or self._find(key) >= 0

    def remove(self, key: bytes) -> int:
        """Drop held ``key`` (an operator's delete, purge or redrive): ``FRONT`` if it
        was back from a lease, ``HELD`` if held, 0 if the group does not hold it."""
        if self.front is not None and key in self.front:
            self.front.remove(key)
            if not self.front:
                self.front = None
            return FRONT
        at = self._find(key)
        if at < 0:
            return 0
        del self._mutable()[at : at + KEY]
        if self.head == len(self.keys):
            self.keys = b""
            self.head = 0
        return HELD

    def put_back(self, key: bytes, where: int) -> None:
        """Hold ``key`` again where ``remove`` took it from (its write was refused)."""
        if where == FRONT:
            self.front = sorted([*(self.front or ()), key])
            return
        keys = self.keys
        lo, hi = 0, (len(keys) - self.head) // KEY
        while lo < hi:
            mid = (lo + hi) // 2
            at = self.head + mid * KEY
            if keys[at : at + KEY] < key:
                lo = mid + 1
            else:
                hi = mid
        at = self.head + lo * KEY
        self._mutable()[at:at] = key

    def keys_after(self, after: bytes) -> list[bytes]:
        """Every held key above ``after``, in key order (operator reads)."""
        keys = self.keys
        out = [bytes(keys[i : i + KEY]) for i in range(self.head, len(keys), KEY)]
        if self.front:
            out = sorted([*out, *self.front])
        return [k for k in out if k > after]
