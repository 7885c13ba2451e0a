"""Where a moved item went: the queue and the new id, for a peek of the old id.

Dead-lettering and redrive do not move an entry: they enqueue a copy under a new id in
the other queue and remove the original, so the old id peeks as "gone" like a released
item. Each move is remembered here, in memory, so that a peek of the old id can say
where the item went. Memory is bounded: the most recent ``MOVES_KEPT`` moves of the
whole server are kept, the oldest forgotten first; a restart forgets them all, and
deleting a queue forgets the moves out of it (a new queue of that name starts its ids
again). Ids are never reused within a queue, so a remembered move is never wrong for
the id it names, only forgotten.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

__all__ = ["MOVES_KEPT", "MovedItems", "MovedTo"]

#: moves remembered by one server (about 300 bytes each)
MOVES_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class MovedTo:
    """The queue an item was moved to and its id there."""

    queue: str
    id: int


class MovedItems:
    """(queue, old id) → ``MovedTo``, the most recent ``capacity`` moves; thread-safe
    (moves are recorded from the threads that complete their writes)."""

    def __init__(self, capacity: int = MOVES_KEPT) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._moves: OrderedDict[tuple[str, int], MovedTo] = OrderedDict()

    def record(self, source: str, old_id: int, target: str, new_id: int) -> None:
        with self._lock:
            self._moves[(source, old_id)] = MovedTo(target, new_id)
            while len(self._moves) > self.capacity:
                self._moves.popitem(last=False)

    def lookup(self, source: str, item_id: int) -> MovedTo | None:
        with self._lock:
            return self._moves.get((source, item_id))

    def forget_queue(self, source: str) -> None:
        with self._lock:
            for key in [k for k in self._moves if k[0] == source]:
                del self._moves[key]
