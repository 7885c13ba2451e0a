"""One group as the delivery index sees it (``storage/delivery.py``): its slots taken
(live leases) and the due items of it that dequeue's cursor has passed but not handed
out — held back by a rule, or waiting for the group's turn.

The held items are keys only (16 bytes each, ``docs/format.md``), packed in the order the
cursor passed them, which is key order: a held item's value and stats stay where its
entry lives (an in-memory segment or a segment file) and are read when it is handed
out. Most groups hold none or one (a group with a lease and its next item), so ``keys``
is the empty ``bytes`` until the first, that key's own ``bytes`` while it is the only
one, and a ``bytearray`` from the second on: a group costs no buffer of its own until
it holds two. Items that came back after their lease ran out (``docs/delivery.md``) go
before the group's other held items; they are rare, so a group keeps them apart, in a
``Back`` it has only while some are on their way or arrived.

Invariant: ``keys`` is sorted and every key in it is a live pending entry at or below
the queue's cursor that no lease holds; so is every key in ``back.keys``, which is
sorted too. ``keys`` is empty exactly when it holds no key, so a plain truth test says
whether the group holds any; ``back`` is None exactly when no item is on its way back
or arrived. A group with no lease, no held item and no item on its way back is dropped
by the index: an idle group costs nothing.
"""

from __future__ import annotations

__all__ = ["FRONT", "HELD", "KEY", "Back", "Group"]

#: bytes of one key (``docs/format.md``, "EntryKey")
KEY = 16
#: where ``Group.remove`` found a key: among the held items, or back from a lease
HELD = 1
FRONT = 2


class Back:
    """A group's items back from an expired lease (``docs/delivery.md``): how many were
    written back and are not reached by the cursor yet (``coming``), and those reached,
    in key order (``keys``), which go before the group's other held items. Rare — only
    while such an item is on its way — so a group keeps one only then."""

    __slots__ = ("coming", "keys")

    def __init__(self) -> None:
        self.coming = 0
        self.keys: list[bytes] = []


class Group:
    """A group's slots and held items; the index's to change (under the queue's lock).

    Five slots (72 bytes with the object's headers: a slot more is 8 bytes a group on
    every group the index holds): what lease expiry brings back lives in ``back``, made
    only then, and ``keys`` needs no offset of its own (a ``bytearray`` cut at its front
    moves its start: amortized O(1) in CPython)."""

    __slots__ = ("back", "keys", "leased", "name", "queued")

    def __init__(self, name: str | None) -> None:
        self.name = name
        #: live leases of the group's items, and ends of leases not yet durable
        self.leased = 0
        self.keys: bytes | bytearray = b""
        #: items back from an expired lease, or None while there are none
        self.back: Back | None = None
        #: on the index's round-robin ring (``fair``)
        self.queued = False

    def __repr__(self) -> str:
        return f"Group({self.name!r}, leased={self.leased}, held={self.held})"

    @property
    def held(self) -> int:
        """Items held: passed by the cursor, not handed out."""
        back = self.back
        return len(self.keys) // KEY + (len(back.keys) if back is not None else 0)

    @property
    def returning(self) -> int:
        """Items back from an expired lease, written back, not yet reached by the
        cursor: the group's other held items wait for them (they come first)."""
        back = self.back
        return 0 if back is None else back.coming

    @property
    def front(self) -> list[bytes]:
        """Keys of items back from an expired lease that the cursor reached, in key
        order: delivered before ``keys``."""
        back = self.back
        return [] if back is None else back.keys

    @property
    def idle(self) -> bool:
        """Nothing to remember: no lease, no held item, nothing on its way back."""
        return not self.leased and self.back is None and not self.keys

    def expect(self) -> None:
        """An item of the group was written back after its lease ran out."""
        back = self.back
        if back is None:
            back = self.back = Back()
        back.coming += 1

    def not_coming(self) -> None:
        """An item ``expect`` counted will not arrive (cancelled, or not stored)."""
        back = self.back
        assert back is not None
        back.coming -= 1
        if not back.coming and not back.keys:
            self.back = None

    def head_key(self) -> bytes | None:
        """The key this group hands out next, if it may hand one out in order: the
        first item back from a lease, else (none on its way back) the first held one."""
        back = self.back
        if back is not None:
            return back.keys[0] if back.keys else None
        keys = self.keys
        return bytes(keys[:KEY]) if keys else None

    def first_key(self) -> bytes | None:
        """The smallest key held (for the age of the oldest due item)."""
        first = bytes(self.keys[:KEY]) if self.keys else None
        back = self.back
        if back is not None and back.keys and (first is None or back.keys[0] < first):
            return back.keys[0]
        return first

    def pop_head(self) -> bytes:
        """Take the key ``head_key`` named."""
        back = self.back
        if back is not None:
            key = back.keys.pop(0)
            if not back.coming and not back.keys:
                self.back = None
            return key
        keys = self.keys
        if len(keys) == KEY:  # the last one: the buffer goes
            self.keys = b""
            return bytes(keys)
        key = bytes(keys[:KEY])
        assert isinstance(keys, bytearray)
        del keys[:KEY]
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
        back = self.back
        assert back is not None
        back.coming -= 1
        back.keys.append(key)

    def _find(self, key: bytes) -> int:
        """Offset of ``key`` in ``keys`` (binary search), or -1."""
        keys = self.keys
        lo, hi = 0, len(keys) // KEY
        while lo < hi:
            mid = (lo + hi) // 2
            at = mid * KEY
            probe = keys[at : at + KEY]
            if probe < key:
                lo = mid + 1
            elif probe > key:
                hi = mid
            else:
                return at
        return -1

    def holds(self, key: bytes) -> bool:
        back = self.back
        return (back is not None and key in back.keys) or self._find(key) >= 0

    def remove(self, key: bytes) -> int:
        """Drop held ``key`` (an operator's delete, purge or redrive): ``FRONT`` if it
        was back from a lease, ``HELD`` if held, 0 if the group does not hold it."""
        back = self.back
        if back is not None and key in back.keys:
            back.keys.remove(key)
            if not back.coming and not back.keys:
                self.back = None
            return FRONT
        at = self._find(key)
        if at < 0:
            return 0
        del self._mutable()[at : at + KEY]
        if not self.keys:
            self.keys = b""
        return HELD

    def put_back(self, key: bytes, where: int) -> None:
        """Hold ``key`` again where ``remove`` took it from (its write was refused)."""
        if where == FRONT:
            back = self.back
            if back is None:
                back = self.back = Back()
            back.keys = sorted([*back.keys, key])
            return
        keys = self.keys
        lo, hi = 0, len(keys) // KEY
        while lo < hi:
            mid = (lo + hi) // 2
            at = mid * KEY
            if keys[at : at + KEY] < key:
                lo = mid + 1
            else:
                hi = mid
        at = lo * KEY
        self._mutable()[at:at] = key

    def keys_after(self, after: bytes) -> list[bytes]:
        """Every held key above ``after``, in key order (operator reads)."""
        keys = self.keys
        out = [bytes(keys[i : i + KEY]) for i in range(0, len(keys), KEY)]
        if self.back is not None and self.back.keys:
            out = sorted([*out, *self.back.keys])
        return [k for k in out if k > after]
