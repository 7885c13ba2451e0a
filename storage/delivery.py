"""The delivery index: what a queue's delivery rules need to choose the next item
without walking the items they hold back (``docs/delivery.md``).

The rules — ``group_limit``, ``leased_limit``, ``fair``, ``rate_limit`` — are a queue's
config. Every front end's dequeue (HTTP, its fast path, the ring, SQS, consumer groups,
Spark) ends in ``Queue.dequeue``, which walks the merged view from the cursor
(``Deliveries.take``); with a rule set, or items still held, that walk asks this index:

- **slots**: a slot is a lease. Each group's count of slots taken (``Group.leased``) and
  the queue's (``taken``) grow when dequeue leases an item and shrink when the record
  that ends the lease (release, requeue, expiry, delete, purge) is durable
  (``ended``, called as the record is published): a refused end gives the lease back
  and its slot was never free, so a limit holds through every failure. They are kept
  whether or not a rule is set, so setting one counts the leases already out.
- **held items**: an entry the view yields that its group may not take now (at its
  limit, out of tokens, items of it ahead of this one, or an item of it on its way back
  from an expired lease) is held: its key goes to its group's FIFO (``storage/held.py``)
  and the cursor passes it once. With ``fair`` every due entry read goes there, and the
  groups take turns. So the queue's invariant (``storage/queue.py``) is: every pending
  entry at or below the cursor is leased, held here, or cancelled by a tombstone.
- **eligible groups**: groups with a held item that may deliver now — a heap by their
  first key (the oldest held item first), or with ``fair`` a round-robin ring. Finding
  the next deliverable item costs O(log groups), not the number held back. A group
  blocked only by its rate limit waits in a timer heap for its next token.

Bounds: the index holds at most ``MAX_HELD`` keys (16 bytes each); once it does,
dequeue serves only what it holds until some are handed out. With ``fair`` it reads
ahead at most ``WINDOW`` due items, ``READ_BUDGET`` per dequeue. A group costs memory
only while it has a lease or a held item. Nothing here is durable: after a restart
nothing is leased, every slot is free, and the index fills again as dequeue walks; the
marks of items on their way back from an expired lease are read again from what is
stored (``storage/returning.py``, ``rebuilt_returning``).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from dq.storage.buckets import Buckets
from dq.storage.held import Group
from dq.storage.leases import Lease
from dq.storage.types import QueueConfig, RateLimit

__all__ = ["MAX_HELD", "READ_BUDGET", "WINDOW", "DeliveryIndex", "GroupFigures"]

#: where ``remove`` found a key that was on its way back from an expired lease
RETURNING = 3
#: keys the index holds at most (16 MB of keys): past it dequeue reads no further
MAX_HELD = 1_000_000
#: with ``fair``, due items read ahead so that the groups among them take turns
WINDOW = 100_000
#: with ``fair``, entries one dequeue reads into the window at most (its latency)
READ_BUDGET = 4096


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One group's figures for operators (``DeliveryIndex.busiest``)."""

    group: str | None
    leased: int
    #: due items the cursor passed that the group has not handed out
    waiting: int
    #: ``waiting`` items the group may not hand out now (a limit, its rate, order)
    held: int


class DeliveryIndex:
    """One queue's slots, held items and eligible groups (see the module docstring).
    Every method runs under the queue's lock."""

    def __init__(self) -> None:
        self.group_limit: int | None = None
        self.leased_limit: int | None = None
        self.fair = False
        self.rate: RateLimit | None = None
        self.buckets: Buckets | None = None
        #: a rule is set (else dequeue takes its plain walk once nothing is held)
        self.has_rules = False
        #: dequeues (or held items) a rate limit refused a delivery, since start
        self.rate_refused = 0
        self.reset()

    def reset(self) -> None:
        """Forget every slot and held item (the queue reloads: nothing is leased)."""
        self.groups: dict[str | None, Group] = {}
        self.taken = 0
        #: keys held, in all groups
        self.indexed = 0
        self._heap: list[tuple[bytes, int, str | None]] = []
        self._ring: deque[Group] = deque()
        self._timers: list[tuple[int, int, str | None]] = []
        self._seq = itertools.count()
        #: key -> group of items back from an expired lease, not reached yet
        self._returning: dict[bytes, str] = {}
        self._returning_keys: list[bytes] = []
        if self.rate is not None:
            self.buckets = Buckets(self.rate, 0)

    @property
    def active(self) -> bool:
        """Dequeue must ask the index: a rule is set, or it holds something."""
        return self.has_rules or self.indexed > 0 or bool(self._returning)

    def configure(self, config: QueueConfig, now: int) -> None:
        """Take the queue's rules (at open, and when its config changes)."""
        self.group_limit = config.group_limit
        self.leased_limit = config.leased_limit
        self.fair = config.fair
        if config.rate_limit != self.rate:
            self.rate = config.rate_limit
            self.buckets = None if self.rate is None else Buckets(self.rate, now)
        self.has_rules = config.has_rules
        # the groups waiting for their turn keep their places (a change of config is no
        # turn of theirs), but for those the new rules stop, which join again at the back
        # once they may deliver; the others join after them
        groups = self.groups
        waiting = [g for g in self._ring if groups.get(g.name) is g]
        self._heap, self._ring, self._timers = [], deque(), []
        for g in groups.values():
            g.queued = False
        offered: set[int] = set()
        for g in (*waiting, *groups.values()):
            if id(g) not in offered:
                offered.add(id(g))
                self._offer(g, now)

    # ------------------------------------------------------------------ slots

    def took(self, group: str | None, now: int) -> str | None:
        """A lease of an item of ``group`` began: it takes a slot and a token. The
        group's name as the index keeps it, for the lease to share (a name read from a
        segment file is a new string for each entry)."""
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = Group(group)
        g.leased += 1
        self.taken += 1
        if self.buckets is not None:
            self.buckets.take(group, now)
        return g.name

    def ended(self, leases: Iterable[tuple[int, Lease]], now: int) -> bool:
        """The ends of ``leases`` are durable: their slots are free. True when that may
        let a waiting dequeue take something (tell the long-polls)."""
        groups = self.groups
        limit = self.leased_limit
        wake = limit is not None and self.taken >= limit
        for _item_id, lease in leases:
            self.taken = max(0, self.taken - 1)
            g = groups.get(lease.group)
            if g is None:
                continue
            g.leased -= 1
            if g.idle:
                del groups[g.name]
            elif g.head_key() is not None:
                self._offer(g, now)
                wake = True
        return wake and self.active

    def under_limit(self, g: Group) -> bool:
        limit = self.group_limit
        return limit is None or g.name is None or g.leased < limit

    def queue_open(self, now: int) -> bool:
        """The queue may hand out one more item now (its ``leased_limit``, and its
        bucket when the rate limit is the queue's)."""
        limit = self.leased_limit
        if limit is not None and self.taken >= limit:
            return False
        b = self.buckets
        return b is None or b.per_group or b.has_token(None, now)

    def at_leased_limit(self) -> bool:
        limit = self.leased_limit
        return limit is not None and self.taken >= limit

    # ------------------------------------------------------------------ holding

    @property
    def full(self) -> bool:
        """The index holds all it may: dequeue reads no further."""
        if self.fair:
            return self.indexed >= WINDOW
        return self.indexed >= MAX_HELD

    def admits(self, group: str | None, now: int) -> bool:
        """An entry of ``group`` the view yields may be handed out now (else ``hold``
        it): nothing of its group is ahead of it, its group is under its limit and
        has a token."""
        g = self.groups.get(group)
        if g is not None:
            if g.back is not None or g.keys:  # items ahead of it, or coming back
                return False
            if not self.under_limit(g):
                return False
        b = self.buckets
        if b is not None and b.per_group and not b.has_token(group, now):
            self.rate_refused += 1
            return False
        return True

    def hold(self, group: str | None, key: bytes, now: int) -> None:
        """The cursor passes ``key``, an entry of ``group`` not handed out now."""
        g = self.groups.get(group)
        if g is None:
            g = self.groups[group] = Group(group)
        first = not g.keys and g.back is None
        g.append(key)
        self.indexed += 1
        if first:
            self._offer(g, now)

    def hold_run(
        self, keys: list[bytes], groups: list[str | None] | None, i: int, end: int, now: int
    ) -> int:
        """The cursor passes ``keys[i:end]`` (the entries of ``groups[i:end]``, or of no
        group), holding each that may not be handed out now (``admits``, ``hold``): the
        position of the first that may, or where it stopped (``end``, or the index
        became full)."""
        admits, hold = self.admits, self.hold
        while i < end:
            group = None if groups is None else groups[i]
            if admits(group, now):
                return i
            hold(group, keys[i], now)
            i += 1
            if self.indexed >= MAX_HELD:
                break
        return i

    def returning(self, keys: dict[bytes, str]) -> None:
        """Items whose lease ran out were written back under ``keys`` (new key ->
        group): each goes before its group's other held items once the cursor reaches
        it, and until then the group hands out nothing else."""
        for key, name in keys.items():
            g = self.groups.get(name)
            if g is None:
                g = self.groups[name] = Group(name)
            g.expect()
            self._returning[key] = name
            heapq.heappush(self._returning_keys, key)

    def rebuilt_returning(self, keys: dict[bytes, str], now: int) -> None:
        """The items on their way back are exactly ``keys`` (key -> group), as read from
        what is stored (``storage/returning.py``) when the queue starts to deliver from
        it: marks not among them are dropped (their groups go on), the others added."""
        marks = self._returning
        for key in [k for k in marks if k not in keys]:
            self._not_returning(marks.pop(key), now)
        self.returning({k: name for k, name in keys.items() if k not in marks})

    @property
    def returning_keys(self) -> dict[bytes, str]:
        """Key -> group of the items back from an expired lease the cursor has not
        reached (the same dict while the index lives: a caller may keep it)."""
        return self._returning

    def is_returning(self, key: bytes) -> bool:
        return key in self._returning

    def arrive(self, key: bytes, now: int) -> None:
        """The view yielded ``key``, an item back from an expired lease: hold it first."""
        name = self._returning.pop(key)
        g = self.groups.get(name)
        if g is None:  # pragma: no cover - a returning item keeps its group
            g = self.groups[name] = Group(name)
            g.expect()
        g.arrive(key)
        self.indexed += 1
        self._offer(g, now)

    def passed(self, after: bytes, now: int) -> bool:
        """The cursor is at ``after``: items on their way back at or below it that it
        did not yield were cancelled meanwhile (deleted, purged); their groups go on.
        True if one of them may hand out a held item now."""
        keys = self._returning_keys
        offered = False
        while keys and keys[0] <= after:
            key = heapq.heappop(keys)
            name = self._returning.pop(key, None)
            if name is not None and self._not_returning(name, now):
                offered = True
        return offered

    def _not_returning(self, name: str, now: int) -> bool:
        """An item group ``name`` waited for will not come back (its mark was dropped):
        the group goes on without it, or is forgotten if it holds nothing else. True if
        it was offered (``_offer``)."""
        g = self.groups.get(name)
        if g is None:
            return False
        g.not_coming()
        if g.idle:
            del self.groups[name]
            return False
        self._offer(g, now)
        return True

    # ------------------------------------------------------------------ choosing

    def _offer(self, g: Group, now: int) -> None:
        """Put ``g`` where dequeue looks if it may deliver its next held item now; if
        only its bucket stops it, wake it when its next token comes."""
        key = g.head_key()
        if key is None or not self.under_limit(g):
            return  # a slot freed, an item arriving or passed offers it again
        b = self.buckets
        if b is not None and b.per_group and not b.has_token(g.name, now):
            heapq.heappush(self._timers, (b.next_token(g.name, now), next(self._seq), g.name))
            return
        if self.fair:
            if not g.queued:
                g.queued = True
                self._ring.append(g)
        else:
            heap = self._heap
            heapq.heappush(heap, (key, next(self._seq), g.name))
            if len(heap) > 2 * len(self.groups) + 1024:
                self._rebuild(now)

    def _rebuild(self, now: int) -> None:
        """Drop stale entries from the heap and the timers (O(1) per push, amortized)."""
        self._heap, self._timers = [], []
        for g in self.groups.values():
            self._offer(g, now)

    def tick(self, now: int) -> None:
        """Groups whose next token has come may deliver again."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            _t, _s, name = heapq.heappop(timers)
            g = self.groups.get(name)
            if g is not None and not g.queued:
                self._offer(g, now)

    def next_group(self, now: int) -> Group | None:
        """The group to hand out from next: its held head is due, and it may."""
        groups = self.groups
        if self.fair:
            ring = self._ring
            while ring:
                g = ring.popleft()
                g.queued = False
                if (
                    groups.get(g.name) is g
                    and g.head_key() is not None
                    and self.under_limit(g)
                    and self._has_token(g, now)
                ):
                    return g
            return None
        heap = self._heap
        while heap:
            key, _s, name = heapq.heappop(heap)
            found = groups.get(name)
            if (
                found is not None
                and found.head_key() == key
                and self.under_limit(found)
                and self._has_token(found, now)
            ):
                return found
        return None

    def _has_token(self, g: Group, now: int) -> bool:
        b = self.buckets
        if b is None or not b.per_group or b.has_token(g.name, now):
            return True
        heapq.heappush(self._timers, (b.next_token(g.name, now), next(self._seq), g.name))
        return False

    def pop_head(self, g: Group) -> bytes:
        """Take ``g``'s next held key to hand it out (``next_group`` chose ``g``)."""
        self.indexed -= 1
        return g.pop_head()

    def done_with(self, g: Group, now: int) -> None:
        """``g``'s head was handed out or set apart: offer its next one, or drop it."""
        if g.idle:
            if self.groups.get(g.name) is g:
                del self.groups[g.name]
        else:
            self._offer(g, now)

    def has_eligible(self, now: int) -> bool:
        """Some held item may be handed out now (a long-poll need not sleep)."""
        self.tick(now)
        if self.fair:
            return any(
                g.head_key() is not None and self.under_limit(g) and self.groups.get(g.name) is g
                for g in itertools.islice(self._ring, 64)
            )
        heap, groups = self._heap, self.groups
        while heap:
            key, _s, name = heap[0]
            g = groups.get(name)
            if g is not None and g.head_key() == key and self.under_limit(g):
                return True
            heapq.heappop(heap)
        return False

    def next_timer(self) -> int | None:
        return self._timers[0][0] if self._timers else None

    def queue_token_at(self, now: int) -> int | None:
        """When the queue's bucket next holds a token, if it holds none now."""
        b = self.buckets
        if b is None or b.per_group or b.has_token(None, now):
            return None
        return b.next_token(None, now)

    # ------------------------------------------------------------------ operators

    def holds(self, key: bytes, group: str | None) -> bool:
        g = self.groups.get(group)
        return g is not None and g.holds(key)

    def remove(
        self, pairs: Iterable[tuple[bytes, str | None]], now: int
    ) -> list[tuple[bytes, str | None, int]]:
        """Stop holding these (key, group) pairs (an operator removes the items: held
        behind the cursor, or on their way back from an expired lease ahead of it); what
        was held, as (key, group, where) for ``put_back``."""
        out: list[tuple[bytes, str | None, int]] = []
        touched: dict[str | None, Group] = {}
        for key, group in pairs:
            name = self._returning.pop(key, None)
            if name is not None:  # on its way back, ahead of the cursor: its group goes on
                back = self.groups[name]
                back.not_coming()
                out.append((key, name, RETURNING))
                touched[name] = back
                continue
            g = self.groups.get(group)
            if g is None:
                continue
            where = g.remove(key)
            if where:
                out.append((key, group, where))
                touched[group] = g
                self.indexed -= 1
        for g in touched.values():
            self.done_with(g, now)
        return out

    def put_back(self, removed: list[tuple[bytes, str | None, int]], now: int) -> None:
        """Hold again what ``remove`` returned (the removal's write was refused)."""
        for key, group, where in removed:
            g = self.groups.get(group)
            if g is None:
                g = self.groups[group] = Group(group)
            if where == RETURNING:
                assert group is not None
                self.returning({key: group})
                continue
            g.put_back(key, where)
            self.indexed += 1
            self._offer(g, now)

    def held_after(self, after: bytes) -> Iterator[tuple[bytes, str | None]]:
        """Every held (key, group) above ``after``, in key order (browse, purge)."""
        streams = [_named(g, after) for g in self.groups.values() if g.held]
        return heapq.merge(*streams, key=lambda kg: kg[0])

    def oldest_key(self) -> bytes | None:
        """The smallest key held (the oldest due item it holds)."""
        firsts = [k for g in self.groups.values() if (k := g.first_key()) is not None]
        return min(firsts) if firsts else None

    def blocked(self, g: Group, now: int) -> bool:
        """``g`` may not hand out its held items now."""
        if g.head_key() is None or not self.under_limit(g):
            return True
        b = self.buckets
        return b is not None and b.per_group and not b.has_token(g.name, now)

    def held_back(self, now: int) -> int:
        """Held items whose group may not hand them out now (the ``held`` gauge)."""
        return sum(g.held for g in self.groups.values() if g.held and self.blocked(g, now))

    def busiest(self, limit: int, now: int) -> list[GroupFigures]:
        """The ``limit`` groups with the most leased and held items."""
        top = heapq.nlargest(
            limit, self.groups.values(), key=lambda g: (g.leased + g.held, g.leased)
        )
        return [
            GroupFigures(g.name, g.leased, g.held, g.held if g.held and self.blocked(g, now) else 0)
            for g in top
        ]


def _named(g: Group, after: bytes) -> Iterator[tuple[bytes, str | None]]:
    name = g.name
    for key in g.keys_after(after):
        yield key, name
