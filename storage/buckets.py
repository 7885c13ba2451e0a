"""A queue's ``rate_limit``: token buckets over its deliveries (``docs/delivery.md``).

A bucket holds up to ``burst`` tokens and gains ``per_second`` a second; a delivery
takes one. It starts full, so a queue that was idle may deliver ``burst`` items at once.
With ``per_group`` each group has its own bucket (the items without a group share one,
under the name ``None``), and a bucket that has filled up again is forgotten: it says
nothing a new, full bucket would not, so groups that are idle cost no memory.

Times are the engine's clock (ms since the epoch); nothing here is durable (after a
restart every bucket is full again, as after an idle spell). Invariant: over any span
of ``t`` ms, a bucket gives at most ``burst + per_second * t / 1000`` tokens.
"""

from __future__ import annotations

import math

from dq.storage.types import RateLimit

__all__ = ["Buckets"]

Group = str | None


class Buckets:
    """The buckets of one queue's ``rate_limit``; every method runs under its lock."""

    __slots__ = ("_groups", "_queue", "_swept", "burst", "per_group", "per_ms")

    def __init__(self, rate: RateLimit, now: int) -> None:
        self.per_ms = rate.per_second / 1000.0
        self.burst = float(rate.burst)
        self.per_group = rate.per_group
        #: the queue's bucket as [tokens, when counted] (unused with ``per_group``)
        self._queue = [self.burst, now]
        #: group -> [tokens, when counted], for groups whose bucket is not full
        self._groups: dict[Group, list[float]] = {}
        self._swept = 0

    def _bucket(self, group: Group, now: int) -> list[float]:
        """The bucket ``group`` draws from, its tokens counted up to ``now``."""
        if not self.per_group:
            bucket = self._queue
        else:
            found = self._groups.get(group)
            if found is None:
                return [self.burst, now]  # a full bucket, not kept until it is drawn on
            bucket = found
        if now > bucket[1]:
            bucket[0] = min(self.burst, bucket[0] + (now - bucket[1]) * self.per_ms)
            bucket[1] = now
        return bucket

    def has_token(self, group: Group, now: int) -> bool:
        """A delivery of an item of ``group`` would find a token now."""
        return self._bucket(group, now)[0] >= 1.0

    def take(self, group: Group, now: int) -> None:
        """Take a token for a delivery of an item of ``group`` (``has_token`` said yes)."""
        bucket = self._bucket(group, now)
        bucket[0] -= 1.0
        if self.per_group and group not in self._groups:
            groups = self._groups
            groups[group] = bucket
            if len(groups) > 2 * self._swept + 1024:
                self._sweep(now)

    def next_token(self, group: Group, now: int) -> int:
        """When (ms) the bucket of ``group`` next holds a whole token (``now`` if it does)."""
        tokens, counted = self._bucket(group, now)
        if tokens >= 1.0:
            return now
        # from when it was counted: the clock may read a little earlier than then
        return max(now, int(counted)) + max(1, math.ceil((1.0 - tokens) / self.per_ms))

    def _sweep(self, now: int) -> None:
        """Forget the buckets that have filled up again: O(1) a token taken, amortized."""
        burst, per_ms = self.burst, self.per_ms
        self._groups = {
            g: b for g, b in self._groups.items() if b[0] + (now - b[1]) * per_ms < burst
        }
        self._swept = len(self._groups)

    @property
    def groups_kept(self) -> int:
        """Groups whose bucket is not known to be full (memory the buckets take)."""
        return len(self._groups)
