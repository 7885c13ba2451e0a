"""A bounded history of queue figures for the dashboard's charts (``GET /v1/history``).

Every ``interval_s`` the sampler reads each queue's stats once and appends one sample
(depth by state, enqueue/dequeue/release rates) to fixed-size rings that hold
``retention_s`` of samples. Invariant: memory is bounded whatever the number of queues —
one ring for all queues together (sums over every queue) plus at most ``max_queues``
per-queue rings, given to the busiest queues (largest depth plus recent enqueues, ties
kept by the queue already tracked). A queue that drops out of that set loses its ring;
it still counts in the all-queues ring. Rings are ``array`` columns of 8-byte numbers,
so (max_queues + 1) x 7 columns x (retention_s / interval_s) slots x 8 bytes in all:
about 4 MiB with the defaults (5 s, 1 hour, 100 queues).

Rates are the engine's per-queue averages over the last minute (``QueueStats``), read at
each sample; a figure the engine does not report is stored as NaN and answered as ``null``.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dq.storage.errors import StorageError

if TYPE_CHECKING:
    from dq.storage import Engine
    from dq.storage.types import QueueStats

__all__ = ["FIELDS", "History", "Sample"]

logger = logging.getLogger(__name__)

FIELDS = ("due", "delayed", "leased", "enqueue_per_s", "dequeue_per_s", "release_per_s")
_NAN = math.nan
#: sampling may take at most 1/_BUDGET of the time
_BUDGET = 10


@dataclass(frozen=True, slots=True)
class Sample:
    """One queue's figures at one time; rates are NaN when the engine has none."""

    due: int
    delayed: int
    leased: int
    enqueue_per_s: float
    dequeue_per_s: float
    release_per_s: float

    def values(self) -> tuple[float, ...]:
        return (
            self.due,
            self.delayed,
            self.leased,
            self.enqueue_per_s,
            self.dequeue_per_s,
            self.release_per_s,
        )


def sample_of(stats: QueueStats) -> Sample:
    def rate(name: str) -> float:
        value = getattr(stats, name, None)  # the engine's one-minute averages
        return _NAN if value is None else float(value)

    return Sample(
        stats.due,
        stats.delayed,
        stats.leased,
        rate("enqueue_per_s"),
        rate("dequeue_per_s"),
        rate("release_per_s"),
    )


class _Ring:
    """``slots`` samples in columns: a time column (ms) and one column per field."""

    __slots__ = ("cols", "count", "head", "slots", "times")

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.times = array("q", bytes(8 * slots))
        self.cols = [array("d", bytes(8 * slots)) for _ in FIELDS]
        self.head = 0  # next slot to write
        self.count = 0

    def append(self, t_ms: int, values: Iterable[float]) -> None:
        i = self.head
        self.times[i] = t_ms
        for col, v in zip(self.cols, values, strict=True):
            col[i] = v
        self.head = (i + 1) % self.slots
        self.count = min(self.count + 1, self.slots)

    def since(self, t_from: int) -> dict[str, list[Any]]:
        """Samples at or after ``t_from``, oldest first, NaN as ``None``."""
        start = (self.head - self.count) % self.slots
        order = [(start + k) % self.slots for k in range(self.count)]
        order = [i for i in order if self.times[i] >= t_from]
        out: dict[str, list[Any]] = {"t": [self.times[i] for i in order]}
        for name, col in zip(FIELDS, self.cols, strict=True):
            out[name] = [_number(col[i]) for i in order]
        return out


def _number(v: float) -> float | int | None:
    if math.isnan(v):
        return None
    return int(v) if v.is_integer() else round(v, 3)


class History:
    """The rings and the sampling loop; ``record`` is the one place that changes them."""

    def __init__(
        self,
        interval_s: float = 5.0,
        retention_s: float = 3600.0,
        max_queues: int = 100,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval_s <= 0 or retention_s < interval_s or max_queues < 0:
            raise ValueError("history needs interval > 0, retention >= interval, max_queues >= 0")
        self.interval_s = interval_s
        self.retention_s = retention_s
        self.max_queues = max_queues
        self.slots = math.ceil(retention_s / interval_s)
        self.clock = clock
        self.total = _Ring(self.slots)
        self.queues: dict[str, _Ring] = {}

    # ---------------------------------------------------------------- recording

    def record(self, t_ms: int, samples: dict[str, Sample]) -> None:
        """Append one sample per queue (and their sum) taken at ``t_ms``."""
        sums = [0.0] * len(FIELDS)
        for s in samples.values():
            for k, v in enumerate(s.values()):
                sums[k] += v  # NaN (a rate the engine does not report) stays NaN
        self.total.append(t_ms, sums)
        keep = self._busiest(samples)
        for name in [n for n in self.queues if n not in keep]:
            del self.queues[name]
        for name in keep:
            ring = self.queues.get(name)
            if ring is None:
                ring = self.queues[name] = _Ring(self.slots)
            ring.append(t_ms, samples[name].values())

    def _busiest(self, samples: dict[str, Sample]) -> set[str]:
        if len(samples) <= self.max_queues:
            return set(samples)

        def score(name: str) -> tuple[float, bool, str]:
            s = samples[name]
            enq = 0.0 if math.isnan(s.enqueue_per_s) else s.enqueue_per_s
            return (s.due + s.delayed + s.leased + enq, name in self.queues, name)

        return set(heapq.nlargest(self.max_queues, samples, key=score))

    def sample(self, engine: Engine) -> None:
        """Read every queue's stats once and record them (runs in a worker thread)."""
        samples: dict[str, Sample] = {}
        for name in engine.list_queues():
            try:
                samples[name] = sample_of(engine.stats(name))
            except StorageError:  # deleted meanwhile, or failing: skip this round
                continue
        self.record(int(self.clock() * 1000), samples)

    async def run(self, engine: Engine) -> None:
        """Sample forever (the lifespan cancels it): every ``interval_s``, or less often
        when sampling is slow (thousands of queues on a busy machine), so that it never
        takes more than a tenth of the time; the rings then simply cover longer."""
        while True:
            started = time.monotonic()
            try:
                await asyncio.to_thread(self.sample, engine)
            except Exception:
                logger.exception("history sample failed")
            took = time.monotonic() - started
            await asyncio.sleep(max(self.interval_s, _BUDGET * took) - took)

    # ---------------------------------------------------------------- reading

    def series(self, queue: str | None, seconds: float) -> dict[str, Any]:
        """The answer of ``GET /v1/history``: columns of samples over the last ``seconds``."""
        t_from = int((self.clock() - seconds) * 1000)
        ring = self.total if queue is None else self.queues.get(queue)
        data = ring.since(t_from) if ring is not None else {"t": [], **{f: [] for f in FIELDS}}
        return {
            "queue": queue,
            "tracked": ring is not None,
            "interval_ms": int(self.interval_s * 1000),
            "max_queues": self.max_queues,
            **data,
        }

    def describe(self) -> dict[str, int]:
        return {
            "interval_ms": int(self.interval_s * 1000),
            "retention_ms": int(self.retention_s * 1000),
            "max_queues": self.max_queues,
            "tracked_queues": len(self.queues),
        }
