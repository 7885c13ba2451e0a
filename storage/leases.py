"""The in-flight set: who holds which item, until when, under which receipt.

Only keys and stats are kept, never values (the storage design, docs/storage.md: "Do
not keep working item values in memory (just IDs)"). Nothing here is durable: after a restart every
unreleased item is pending again (at-least-once). A receipt names one delivery:
``<epoch>.<id hex>.<delivery hex>``; the epoch is random per queue opening, so a
receipt from before a restart (or from a deleted-and-recreated queue) is stale.
"""

from __future__ import annotations

import heapq
import secrets
from collections import deque
from dataclasses import dataclass

from dq.storage.errors import InvalidReceipt, ItemNotFound, StaleReceipt

__all__ = ["Lease", "Leases"]


@dataclass(slots=True)
class Lease:
    """One live delivery. ``source`` hints where the pending entry lives (for value lookups)."""

    key: bytes
    enqueue_time: int
    requeue_time: int
    dequeue_count: int
    expires: int
    delivery: int
    source: object | None
    #: when this delivery began (dequeue time; extends keep it)
    since: int = 0
    #: the item's group (``docs/delivery.md``): its slot, and what a requeue writes again
    group: str | None = None


class Leases:
    def __init__(self) -> None:
        self.epoch = secrets.token_hex(4)
        self._by_id: dict[int, Lease] = {}
        #: (expires, id, delivery) of every lease, a heap lazily pruned: an ended or
        #: extended lease leaves its entry behind, so the first entry's expiry is never
        #: later than a live lease's — a dequeue that finds it after now knows no lease
        #: ran out without a call (``Queue.dequeue``)
        self.expiries: list[tuple[int, int, int]] = []
        self._deliveries = 0
        # (since, id, delivery) of every lease in dequeue order, lazily pruned: ``oldest_since``
        # reads the first live entry instead of walking every lease. ``since`` only grows
        # while the clock does; an entry older than the last one (a lease put back after a
        # refused write, the wall clock stepping back) goes to the small heap ``_late``.
        self._order: deque[tuple[int, int, int]] = deque()
        self._late: list[tuple[int, int, int]] = []

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, item_id: int) -> bool:
        return item_id in self._by_id

    def add(
        self,
        item_id: int,
        key: bytes,
        stats: tuple[int, int, int],
        expires: int,
        source: object | None,
        since: int = 0,
        group: str | None = None,
    ) -> str:
        self._deliveries += 1
        d = self._deliveries
        self._by_id[item_id] = Lease(
            key, stats[0], stats[1], stats[2], expires, d, source, since, group
        )
        self._push(expires, item_id, d)
        order = self._order
        if order and since < order[-1][0]:
            heapq.heappush(self._late, (since, item_id, d))
        else:
            order.append((since, item_id, d))
        if len(order) + len(self._late) > 2 * len(self._by_id) + 1024:
            self._reindex_since()
        return f"{self.epoch}.{item_id:x}.{d:x}"

    def restore(self, item_id: int, lease: Lease) -> None:
        """Put back a lease taken out for a write that was then refused: the same
        delivery, so its receipt still works (a refusal changes nothing)."""
        self._by_id[item_id] = lease
        self._push(lease.expires, item_id, lease.delivery)
        heapq.heappush(self._late, (lease.since, item_id, lease.delivery))
        if len(self._order) + len(self._late) > 2 * len(self._by_id) + 1024:
            self._reindex_since()

    def _reindex_since(self) -> None:
        """Rebuild the dequeue-time index from the live leases once entries of ended leases
        dominate it (as ``_push`` does for expiries): a lease far older than the ones
        released behind it would otherwise keep them all. O(1) amortized per lease added."""
        entries = sorted((lease.since, i, lease.delivery) for i, lease in self._by_id.items())
        self._order, self._late = deque(entries), []

    def _push(self, expires: int, item_id: int, delivery: int) -> None:
        """Add an expiry; rebuild the heap when entries of ended leases dominate it.

        Released leases leave their entry behind (deleting from a heap is O(n)); with
        long leases those would pile up until they expire — hundreds of MB for a busy
        queue with 10-minute leases. Rebuilding once stale entries outnumber live ones
        keeps the heap within 2x the live leases at O(1) amortized cost.
        """
        heap = self.expiries
        heapq.heappush(heap, (expires, item_id, delivery))
        if len(heap) > 2 * len(self._by_id) + 1024:
            self.expiries = [(lease.expires, i, lease.delivery) for i, lease in self._by_id.items()]
            heapq.heapify(self.expiries)

    def receipt(self, item_id: int, lease: Lease) -> str:
        return f"{self.epoch}.{item_id:x}.{lease.delivery:x}"

    def check(self, item_id: int, receipt: str, next_id: int, now: int) -> Lease:
        """The live lease ``receipt`` names, or raise why not."""
        parts = receipt.split(".") if isinstance(receipt, str) else []
        try:
            if len(parts) != 3:
                raise ValueError
            epoch, rid, delivery = parts[0], int(parts[1], 16), int(parts[2], 16)
        except ValueError:
            raise InvalidReceipt("malformed receipt", id=item_id, receipt=receipt) from None
        if rid != item_id:
            raise InvalidReceipt("receipt is for another item", id=item_id, receipt=receipt)
        if item_id >= next_id or item_id <= 0:
            raise ItemNotFound("no item with this id was ever enqueued here", id=item_id)
        lease = self._by_id.get(item_id)
        if (
            epoch != self.epoch
            or lease is None
            or lease.delivery != delivery
            or lease.expires <= now
        ):
            raise StaleReceipt(
                "that delivery is over (released, requeued, expired, or the server restarted)",
                id=item_id,
            )
        return lease

    def get(self, item_id: int) -> Lease | None:
        return self._by_id.get(item_id)

    def values(self) -> list[tuple[int, Lease]]:
        """Every live lease as (id, lease): for operator reads (browse, stats)."""
        return list(self._by_id.items())

    def oldest_since(self) -> int | None:
        """The earliest dequeue time (``Lease.since``) of a live lease, None if none.

        Amortized O(1) (O(log n) for out-of-order entries): entries of ended leases at the
        front are dropped once each, so stats read every second never walk 100k leases.
        """
        by_id, order, late = self._by_id, self._order, self._late
        while order:
            _, item_id, d = order[0]
            lease = by_id.get(item_id)
            if lease is not None and lease.delivery == d:
                break
            order.popleft()
        while late:
            _, item_id, d = late[0]
            lease = by_id.get(item_id)
            if lease is not None and lease.delivery == d:
                break
            heapq.heappop(late)
        if order and late:
            return min(order[0][0], late[0][0])
        if order:
            return order[0][0]
        return late[0][0] if late else None

    def pop(self, item_id: int) -> Lease:
        return self._by_id.pop(item_id)

    def extend(self, item_id: int, lease: Lease, expires: int) -> None:
        lease.expires = expires
        self._push(expires, item_id, lease.delivery)

    def next_expiry(self) -> int | None:
        heap = self.expiries
        while heap:
            expires, item_id, d = heap[0]
            lease = self._by_id.get(item_id)
            if lease is not None and lease.delivery == d and lease.expires == expires:
                return expires
            heapq.heappop(heap)
        return None

    def pop_expired(self, now: int) -> list[tuple[int, Lease]]:
        out: list[tuple[int, Lease]] = []
        heap = self.expiries
        while heap and heap[0][0] <= now:
            expires, item_id, d = heapq.heappop(heap)
            lease = self._by_id.get(item_id)
            if lease is not None and lease.delivery == d and lease.expires == expires:
                del self._by_id[item_id]
                out.append((item_id, lease))
        return out
