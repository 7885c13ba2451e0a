"""``/metrics`` series of the scheduler (``storage/scheduler.py``), read at scrape time.

Counts are this server's since it started, and only while it fires (one alone, or a
replica group's leader): a follower shows ``dq_schedules`` 0 and counts nothing. Lateness
is from a tick's time to its item being durable (answered by the log, and on a leader
by the sync set), for ticks fired within the server's term; ticks fired after downtime
(``catch_up``) are counted apart, their lateness being the downtime.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from dq.storage.scheduler import LATENESS_BUCKETS

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from dq.storage.scheduler import Scheduler

__all__ = ["ScheduleCollector"]


class ScheduleCollector(Collector):
    def __init__(self, current: Callable[[], Scheduler | None]) -> None:
        self._current = current

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        scheduler = self._current()
        if scheduler is None:
            return
        st = scheduler.stats
        gauge = GaugeMetricFamily("dq_schedules", "Schedules this server fires (0 unless it leads)")
        gauge.add_metric([], float(st.schedules))
        yield gauge
        for name, doc, value in (
            ("dq_schedule_ticks", "Schedule ticks enqueued (durable)", st.fired),
            (
                "dq_schedule_ticks_caught_up",
                "Ticks enqueued after downtime, as catch_up said (counted in ticks too)",
                st.caught_up,
            ),
            (
                "dq_schedule_ticks_skipped",
                "Ticks never enqueued: missed with catch_up skip or latest, or past 1,000",
                st.skipped,
            ),
            (
                "dq_schedule_write_failures",
                "Tick writes refused (a full disk, a stalled group) and tried again",
                st.failed_writes,
            ),
        ):
            counter = CounterMetricFamily(name, doc)
            counter.add_metric([], float(value))
            yield counter
        hist = HistogramMetricFamily(
            "dq_schedule_lateness_seconds", "From a tick's time to its item being durable"
        )
        acc, pairs = 0, []
        for bound, n in zip((*LATENESS_BUCKETS, float("inf")), list(st.buckets), strict=True):
            acc += n
            pairs.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(acc)))
        hist.add_metric([], pairs, st.lateness_sum)
        yield hist
