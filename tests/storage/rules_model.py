"""The model state machine's view of ``rate_limit`` and ``fair`` (``docs/delivery.md``).

``TokenModel`` is the token bucket a queue's deliveries draw on, counted exactly (in
fractions: the machine's rates are powers of two per millisecond, which the engine's
floats hold exactly too, so the two agree to the token). It also keeps each bucket's
deliveries and checks the promise itself, apart from how the bucket is counted: over
any span of ``t`` ms a bucket gives at most ``burst + per_second * t / 1000`` tokens.

``Turns`` checks what ``fair`` promises without copying how the engine keeps its turn:
once a group may deliver, no other group is served twice before it is.
"""

from __future__ import annotations

from fractions import Fraction

from dq.storage import RateLimit

__all__ = ["QUEUE", "TokenModel", "Turns"]

#: the name of the whole queue's bucket (a group is a string, or None for the items
#: without one)
QUEUE = ("the queue",)

Bucket = str | None | tuple[str]


class TokenModel:
    """One queue's ``rate_limit`` buckets, all full when it was set (or the engine
    started: buckets are not durable)."""

    def __init__(self, rate: RateLimit) -> None:
        self.rate = rate
        self.per_ms = Fraction(rate.per_second) / 1000
        self.burst = Fraction(rate.burst)
        #: bucket -> (tokens, when counted); a bucket not here is full
        self.buckets: dict[Bucket, tuple[Fraction, int]] = {}
        #: bucket -> times of its deliveries
        self.deliveries: dict[Bucket, list[int]] = {}

    def bucket_of(self, group: str | None) -> Bucket:
        return group if self.rate.per_group else QUEUE

    def tokens(self, bucket: Bucket, now: int) -> Fraction:
        tokens, counted = self.buckets.get(bucket, (self.burst, now))
        return min(self.burst, tokens + (now - counted) * self.per_ms)

    def take(self, group: str | None, now: int) -> None:
        """A delivery of an item of ``group`` at ``now``: it takes a token, and the
        bucket's deliveries stay within the promise."""
        bucket = self.bucket_of(group)
        tokens = self.tokens(bucket, now)
        assert tokens >= 1, f"delivered without a token: {bucket}, {tokens} at {now}"
        self.buckets[bucket] = (tokens - 1, now)
        times = self.deliveries.setdefault(bucket, [])
        times.append(now)
        for n, since in enumerate(times):
            allowed = self.burst + self.per_ms * (now - since)
            assert len(times) - n <= allowed, (
                f"{len(times) - n} deliveries of {bucket} within {now - since} ms under {self.rate}"
            )


class Turns:
    """``fair``: for each group that may deliver, the groups served since it could.

    A group joins when a check finds it may deliver (the checks are the deliveries);
    it leaves when one finds it may not, or when it is served. Serving a group that
    already had its turn while another waited breaks the rule. The turns are not
    durable, and the engine keeps no turn across a restart."""

    def __init__(self) -> None:
        self.waiting: dict[str | None, set[str | None]] = {}

    def forget(self, group: str | None = None, *, every: bool = False) -> None:
        if every:
            self.waiting.clear()
        else:
            self.waiting.pop(group, None)

    def served(self, group: str | None, could: set[str | None], exempt: set[str | None]) -> None:
        """``group`` is served while the groups ``could`` may deliver; a group in
        ``exempt`` may have had a turn no delivery shows (an item of it moved to the
        dead-letter queue by the same dequeue), so its wait is not checked."""
        assert group in could, f"group {group!r} served out of turn: it may not deliver"
        for name in list(self.waiting):
            if name not in could:
                del self.waiting[name]
        for name in could:
            if name == group:
                continue
            seen = self.waiting.setdefault(name, set())
            assert name in exempt or group not in seen, (
                f"group {group!r} served twice while group {name!r} waited for its turn"
            )
            seen.add(group)
        self.waiting[group] = set()
