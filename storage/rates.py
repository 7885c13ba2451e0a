"""Per-queue event rates over the last minute, for operators (stats, dashboard).

Sixty one-second buckets per kind of event, and a running total per kind (the
telemetry ring's rates are differences of totals); adding is a few list and dict
writes under the queue lock the caller already holds. Nothing here is durable: rates
and totals start at zero when the server starts.
"""

from __future__ import annotations

__all__ = ["RATE_KINDS", "Rates"]

RATE_KINDS = ("enqueue", "dequeue", "release")
_WINDOW_S = 60


class Rates:
    __slots__ = ("_counts", "_last", "_seconds", "_totals")

    def __init__(self) -> None:
        self._counts = {k: [0] * _WINDOW_S for k in RATE_KINDS}
        self._seconds = {k: [0] * _WINDOW_S for k in RATE_KINDS}
        #: the last second with an event of each kind: an idle queue answers in O(1)
        #: (listing 1,000 queues reads 3,000 rates)
        self._last = dict.fromkeys(RATE_KINDS, -1)
        self._totals = dict.fromkeys(RATE_KINDS, 0)

    def add(self, kind: str, n: int, now_ms: int) -> None:
        sec = now_ms // 1000
        slot = sec % _WINDOW_S
        seconds = self._seconds[kind]
        counts = self._counts[kind]
        if seconds[slot] != sec:
            seconds[slot] = sec
            counts[slot] = 0
        counts[slot] += n
        self._last[kind] = sec
        self._totals[kind] += n

    def total(self, kind: str) -> int:
        """Items of this kind since the server started (read without the queue lock:
        an int read whole, at worst one add behind)."""
        return self._totals[kind]

    def per_second(self, kind: str, now_ms: int) -> float:
        """Events per second over the last 60 seconds (the current second included)."""
        oldest = now_ms // 1000 - _WINDOW_S
        if self._last[kind] <= oldest:
            return 0.0
        seconds, counts = self._seconds[kind], self._counts[kind]
        total = sum(c for s, c in zip(seconds, counts, strict=True) if s > oldest)
        return total / _WINDOW_S
