"""Prometheus metrics of one app: its own ``CollectorRegistry``, never the global one.

Owns: per-operation request counts and latencies, delivery lateness (dequeue time -
deadline), items per operation, and — read live at scrape time from the engine —
queue depths and fsync latency. Invariant: recording on the hot path is a few plain
integer updates on the event loop thread (no locks, no label lookups); nothing here
calls the engine except the scrape-time collector.
"""

from __future__ import annotations

import logging
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["OPERATIONS", "Metrics"]

logger = logging.getLogger(__name__)

OPERATIONS = (
    "enqueue",
    "dequeue",
    "release",
    "requeue",
    "fail",
    "extend",
    "queue_get",
    "queue_put",
    "queue_delete",
    "queue_list",
    "queue_groups",
    "pause",
    "resume",
    "browse",
    "peek",
    "purge",
    "delete_item",
    "key_get",
    "key_cancel",
    "key_patch",
    "redrive",
    "backup",
    "schedule_put",
    "schedule_get",
    "schedule_delete",
    "schedule_pause",
    "schedule_resume",
    "schedule_run",
)
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)  # fmt: skip
_LATENESS_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 3600.0)


class Metrics:
    """The app's metrics; ``observe_*`` methods are what the routes call."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._ops = _Operations()
        self.registry.register(self._ops)
        self._lateness = _BatchHistogram(
            "dq_delivery_lateness_seconds",
            "Dequeue time minus the item's deadline",
            _LATENESS_BUCKETS,
        )
        self.registry.register(self._lateness)

    def observe(self, operation: str, seconds: float, items: int = 1) -> None:
        # What ``_Operations.observe`` does for "ok", inline: it runs once per request.
        op = self._ops.ops[operation]
        op.outcomes["ok"] += 1
        op.buckets[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        op.seconds += seconds
        op.items += items

    def observe_error(self, operation: str, code: str, seconds: float) -> None:
        self._ops.observe(operation, code, seconds, 0)

    def observe_lateness(self, now_ms: int, deadlines: Iterable[int]) -> None:
        self._lateness.observe_many_ms([now_ms - d for d in deadlines])

    def watch_engine(self, current: Callable[[], Engine | None], max_queues: int) -> None:
        """Publish live figures (depths, fsync latency) of ``current()`` at scrape time,
        per queue for the first ``max_queues`` queues by name (a scrape runs on the event
        loop: its cost must stay bounded however many queues there are)."""
        self.registry.register(_EngineCollector(current, max_queues))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Op:
    __slots__ = ("buckets", "items", "outcomes", "seconds")

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = {"ok": 0}
        self.buckets = [0] * (len(_LATENCY_BUCKETS) + 1)
        self.seconds = 0.0
        self.items = 0


class _Operations(Collector):
    """Request counts, latencies and item counts per operation.

    ``prometheus_client`` metrics take a lock per update (~3 µs for the three updates of
    a request, a tenth of a small enqueue). These plain counters are updated only on
    the event loop thread, which also serves ``/metrics``, so they need no lock; a
    scrape from another thread may read a count one update behind, never a torn one.
    """

    def __init__(self) -> None:
        self.ops = {op: _Op() for op in OPERATIONS}

    def observe(self, operation: str, outcome: str, seconds: float, items: int) -> None:
        op = self.ops[operation]
        outcomes = op.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        op.buckets[bisect_left(_LATENCY_BUCKETS, seconds)] += 1
        op.seconds += seconds
        op.items += items

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "dq_requests",
            "Queue operations served over HTTP, by operation and outcome",
            labels=["operation", "outcome"],
        )
        latency = HistogramMetricFamily(
            "dq_request_duration_seconds",
            "Time to serve a queue operation (dequeue includes its long-poll wait)",
            labels=["operation"],
        )
        items = CounterMetricFamily(
            "dq_items",
            "Items handled, by operation (a batch counts each item)",
            labels=["operation"],
        )
        for name, op in self.ops.items():
            for outcome, n in list(op.outcomes.items()):
                requests.add_metric([name, outcome], float(n))
            acc, pairs = 0, []
            for bound, n in zip((*_LATENCY_BUCKETS, float("inf")), list(op.buckets), strict=True):
                acc += n
                pairs.append((_bound(bound), float(acc)))
            latency.add_metric([name], pairs, op.seconds)
            items.add_metric([name], float(op.items))
        yield requests
        yield latency
        yield items


class _BatchHistogram(Collector):
    """A histogram fed a batch at a time: one lock and a bisect per value.

    ``prometheus_client.Histogram.observe`` takes ~1 µs a value; a dequeue of 100
    items would spend 0.1 ms on lateness alone.
    """

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self._name = name
        self._doc = documentation
        self._bounds_ms = [b * 1000.0 for b in buckets]
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)
        self._sum_ms = 0
        self._lock = threading.Lock()

    def observe_many_ms(self, values_ms: list[int]) -> None:
        if not values_ms:
            return
        bounds, counts = self._bounds_ms, self._counts
        with self._lock:
            for v in values_ms:
                if v < 0:
                    v = 0
                counts[bisect_left(bounds, v)] += 1
                self._sum_ms += v

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, total = list(self._counts), self._sum_ms
        fam = HistogramMetricFamily(self._name, self._doc)
        acc, pairs = 0, []
        for bound, n in zip((*self._bounds, float("inf")), counts, strict=True):
            acc += n
            pairs.append((_bound(bound), float(acc)))
        fam.add_metric([], pairs, total / 1000.0)
        yield fam


class _EngineCollector(Collector):
    """Reads queue stats and the engine's fsync histogram only when scraped."""

    def __init__(self, current: Callable[[], Engine | None], max_queues: int) -> None:
        self._current = current
        self._max_queues = max_queues

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        engine = self._current()
        if engine is None:
            return
        yield from self._depths(engine)
        fsync = self._fsync(engine)
        if fsync is not None:
            yield fsync
        yield from self._group_commits(engine)

    def _depths(self, engine: Engine) -> Iterator[Metric]:
        labels = ["queue"]
        families = {
            name: GaugeMetricFamily(f"dq_queue_{name}", help_, labels=labels)
            for name, help_ in (
                ("pending", "Items stored and not released (due, delayed or leased)"),
                ("due", "Items due now and not leased"),
                ("delayed", "Items whose deadline is in the future"),
                ("leased", "Items currently leased to a consumer"),
                ("segments", "Segment files of the queue"),
                ("bytes_on_disk", "Bytes of WAL and segment files"),
                ("oldest_due_age_seconds", "Age of the oldest due item"),
                (
                    "oldest_lease_age_seconds",
                    "Age of the oldest live lease, from its dequeue (extends do not reset it)",
                ),
                ("paused", "1 while the queue is paused"),
                ("groups", "Groups with a leased or a held item (docs/delivery.md)"),
                ("held", "Due items the delivery rules hold back now"),
                ("failed", "1 while the queue refuses work after an I/O error (until it reopens)"),
                ("damaged", "1 while the queue is quarantined: damage found on disk"),
            )
        }
        faults = {
            name: CounterMetricFamily(f"dq_queue_{name}", help_, labels=labels)
            for name, help_ in (
                ("io_errors", "I/O errors (disk full, EIO, a failed fsync) that failed the queue"),
                ("freeze_failures", "Failed attempts to write a log's segment file (retried)"),
            )
        }
        dead = CounterMetricFamily(
            "dq_queue_dead_lettered",
            "Items moved to the dead-letter queue since the server started",
            labels=labels,
        )
        expired = CounterMetricFamily(
            "dq_queue_lease_expired",
            "Leases that ran out (the item went back to the queue) since the server started",
            labels=labels,
        )
        refused = CounterMetricFamily(
            "dq_queue_rate_limited",
            "Deliveries the queue's rate limit refused since the server started",
            labels=labels,
        )
        try:
            names = engine.list_queues()
        except Exception:  # a closed engine: publish no depths rather than fail the scrape
            logger.debug("queue depths unavailable", exc_info=True)
            return
        count = GaugeMetricFamily(
            "dq_queues",
            "Queues that exist (per-queue series: the first DQ_METRICS_MAX_QUEUES by name)",
        )
        count.add_metric([], float(len(names)))
        yield count
        for name in names[: self._max_queues]:
            try:
                s = engine.stats(name)
            except Exception:  # deleted between list and stats
                continue
            for field in ("pending", "due", "delayed", "leased", "segments", "bytes_on_disk"):
                families[field].add_metric([name], float(getattr(s, field)))
            age = s.oldest_due_age_ms
            families["oldest_due_age_seconds"].add_metric([name], (age or 0) / 1000.0)
            lease_age = s.oldest_lease_age_ms
            families["oldest_lease_age_seconds"].add_metric([name], (lease_age or 0) / 1000.0)
            families["paused"].add_metric([name], 1.0 if s.paused else 0.0)
            families["groups"].add_metric([name], float(s.groups))
            families["held"].add_metric([name], float(s.held))
            refused.add_metric([name], float(s.rate_limited))
            # a queue's faults, for alerts: stats().extra counts them since the start
            for field in ("failed", "damaged"):
                families[field].add_metric([name], float(s.extra.get(field, 0)))
            for field, family in faults.items():
                family.add_metric([name], float(s.extra.get(field, 0)))
            dead.add_metric([name], float(s.dead_lettered))
            expired.add_metric([name], float(s.lease_expired))
        yield from families.values()
        yield from faults.values()
        yield dead
        yield expired
        yield refused

    def _fsync(self, engine: Engine) -> Metric | None:
        """The engine's fsync latency histogram (``engine.fsync_stats``), if it has one."""
        stats = getattr(engine, "fsync_stats", None)
        if stats is None:
            return None
        _count, total, buckets = stats.snapshot()
        fam = HistogramMetricFamily(
            "dq_fsync_duration_seconds", "Time the engine spends in one (group) fsync"
        )
        fam.add_metric([], [(_bound(b), float(c)) for b, c in buckets], float(total))
        return fam

    def _group_commits(self, engine: Engine) -> Iterator[Metric]:
        """Who runs the group commits (``storage/syncer.py``): the syncer thread, or the
        threads that serve requests (the event loop, shared-memory sessions) — and how
        often a slow disk made those hand their writes to the syncer thread."""
        syncer = getattr(engine, "syncer", None)
        if syncer is None:
            return
        by_syncer, inline, handed_back = syncer.counts()
        rounds = CounterMetricFamily(
            "dq_group_commits",
            "Sync rounds (one queue's log written and fsynced), by the thread that ran them",
            labels=["thread"],
        )
        rounds.add_metric(["syncer"], float(by_syncer))
        rounds.add_metric(["request"], float(inline))
        yield rounds
        slow = CounterMetricFamily(
            "dq_group_commits_handed_back",
            "Writes a request-serving thread left to the syncer thread because recent "
            "group commits averaged over 2 ms (a slow disk)",
        )
        slow.add_metric([], float(handed_back))
        yield slow


def _bound(b: object) -> str:
    if isinstance(b, str):
        return b
    f = float(b)  # type: ignore[arg-type]
    return "+Inf" if f == float("inf") else repr(f)
