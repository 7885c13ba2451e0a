"""How many of a queue's items are due and delayed, and how late the oldest due one
is: exact, from the counts of its sources, without walking its items.

Which entries are live follows the queue's invariant (``storage/queue.py``): at or
below the dequeue cursor an entry is leased or cancelled; above it, the entries of one
(deadline, id) count as a multiset, pendings +1 and tombstones -1 wherever each
lives (a tombstone in one segment file cancels a pending entry in another). Every
source answers ``net_upto(key)``, its pendings minus tombstones at or below ``key``
(``MemSegment`` by bisection, a segment file through ``SegmentCounts``), so:

- ``due``: the net count of every source between the cursor's tombstone (its whole
  (deadline, id) is behind) and now's last key ``(now, MAX_ID, tombstone)``;
- ``delayed``: the net count above now's last key;
- ``pending``: the net count of everything (leased items included);
- the oldest due item's deadline: the first deadline ``d`` for which the net count up
  to ``(d, MAX_ID, tombstone)`` is above zero. That count only grows with ``d``
  (each (deadline, id) adds its pendings less its tombstones, never less than zero),
  so ``d`` is found by a search from the first key after the cursor, and remembered:
  while no item older than it arrives and it is not taken, checking it again costs
  two counts. Cancelled entries between the cursor and that item (after a restart,
  on a follower, after a purge) are never walked one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dq.storage.codec import MAX_ID, TOMBSTONE, encode_key, key_deadline, tombstone_of

__all__ = ["CountSource", "Counted", "StateCounter"]


class CountSource(Protocol):
    """What a source of a queue answers: a ``MemSegment`` or a ``SegmentCounts``."""

    @property
    def net_total(self) -> int: ...

    def net_upto(self, key: bytes) -> int: ...


@dataclass(frozen=True, slots=True)
class Counted:
    pending: int
    due: int
    delayed: int
    #: the deadline of the oldest due item (None: nothing due)
    oldest_due: int | None


def _last_key(deadline: int) -> bytes:
    """The largest key of ``deadline``: every (deadline, id) of it sorts at or below."""
    return encode_key(deadline, MAX_ID, TOMBSTONE)


class StateCounter:
    """Counts a queue's sources; remembers the oldest due deadline between calls."""

    __slots__ = ("_oldest",)

    def __init__(self) -> None:
        self._oldest: int | None = None

    def probes(self, cursor: bytes, now: int, head: bytes | None) -> list[bytes]:
        """The keys ``count`` with the same arguments asks every source first: a segment
        file learns its counts there without the queue's lock beforehand
        (``SegmentCounts.learn``), so the count itself decodes nothing."""
        low = tombstone_of(cursor) if cursor else b""
        keys = [max(_last_key(now), low)]
        if low:
            keys.append(low)
        if head is not None and key_deadline(head) <= now:
            keys.append(_last_key(key_deadline(head)))  # the oldest due item's search
        return keys

    def count(
        self, sources: Sequence[CountSource], cursor: bytes, now: int, head: bytes | None
    ) -> Counted:
        """``cursor``: the dequeue cursor (b"" before the first dequeue); ``head``: the
        first key after it in any source (None if none), where the oldest due item's
        search starts."""
        low = tombstone_of(cursor) if cursor else b""
        high = max(_last_key(now), low)
        base = upto = total = 0
        for s in sources:
            base += s.net_upto(low) if low else 0
            upto += s.net_upto(high)
            total += s.net_total
        due = max(upto - base, 0)
        delayed = max(total - upto, 0)
        oldest = None
        if due > 0 and head is not None:
            oldest = self._oldest_due(sources, base, key_deadline(head), now)
        return Counted(max(total, 0), due, delayed, oldest)

    def _oldest_due(self, sources: Sequence[CountSource], base: int, first: int, now: int) -> int:
        """The smallest deadline in ``[first, now]`` with items due up to it (there is
        one: the caller counted some due)."""

        def due_upto(deadline: int) -> int:
            key = _last_key(deadline)
            return sum(s.net_upto(key) for s in sources) - base

        hint = self._oldest
        if (
            hint is not None
            and first <= hint <= now
            and due_upto(hint) > 0
            and (hint == first or due_upto(hint - 1) <= 0)
        ):
            return hint
        if due_upto(first) > 0:
            found = first
        else:
            # gallop from the first key, then bisect: (lo has none due, hi has some)
            lo, step = first, 1
            while True:
                hi = min(lo + step, now)
                if hi >= now or due_upto(hi) > 0:
                    break
                lo, step = hi, step * 2
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if due_upto(mid) > 0:
                    hi = mid
                else:
                    lo = mid
            found = hi
        self._oldest = found
        return found
