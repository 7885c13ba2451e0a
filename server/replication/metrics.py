"""The leader's replication figures in ``/metrics``, read from its ``Replicator`` when
scraped (nothing on a member that does not lead, or without replication).

``dq_replication_epoch``, ``dq_replication_lsn`` (last lsn shipped),
``dq_replication_commit_lsn``, ``dq_replication_window_bytes`` (frames kept for the
followers), and per attached follower ``dq_replication_follower_lag`` (lsns shipped and
not yet acknowledged by it) and ``dq_replication_follower_in_sync`` (1 while counted in
commits). Listed in docs/http.md ("Metrics").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from dq.server.replication.leader import Replicator

__all__ = ["ReplicationCollector"]


class ReplicationCollector(Collector):
    def __init__(self, current: Callable[[], Replicator | None]) -> None:
        self._current = current

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        rep = self._current()
        if rep is None or rep.closed:
            return
        last = rep.last_lsn
        for name, help_, value in (
            ("epoch", "The epoch this member leads", rep.epoch),
            ("lsn", "The last log sequence number shipped", last),
            ("commit_lsn", "The highest lsn the sync set holds", rep.commit_lsn),
            ("window_bytes", "Frame bytes kept for the followers", rep.window()[2]),
        ):
            yield GaugeMetricFamily(f"dq_replication_{name}", help_, value=value)
        lag = GaugeMetricFamily(
            "dq_replication_follower_lag",
            "Lsns shipped that the follower has not acknowledged",
            labels=["node"],
        )
        in_sync = GaugeMetricFamily(
            "dq_replication_follower_in_sync",
            "1 while the leader counts the follower in its commits",
            labels=["node"],
        )
        for node, f in sorted(rep.followers().items()):
            lag.add_metric([node], last - max(f.acked, 0))
            in_sync.add_metric([node], 1 if f.in_sync else 0)
        yield lag
        yield in_sync
