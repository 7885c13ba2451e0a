"""The app's Prometheus metrics: own registry, batched lateness, live engine figures."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dq.client import Client
from dq.server.metrics import Metrics
from dq.storage import Engine, EngineConfig, NewItem
from tests.server.live import live_server


def _samples(m: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_lateness_buckets_are_cumulative() -> None:
    m = Metrics()
    m.observe_lateness(10_000, [10_000, 9_998, 9_000, 10_005])  # 0, 2 ms, 1 s, early → 0
    s = _samples(m)
    assert s[("dq_delivery_lateness_seconds_bucket", (("le", "0.001"),))] == 2
    assert s[("dq_delivery_lateness_seconds_bucket", (("le", "0.005"),))] == 3
    assert s[("dq_delivery_lateness_seconds_bucket", (("le", "1.0"),))] == 4
    assert s[("dq_delivery_lateness_seconds_count", ())] == 4
    assert abs(s[("dq_delivery_lateness_seconds_sum", ())] - 1.002) < 1e-9


def test_operations_and_engine_figures(tmp_path: Path) -> None:
    m = Metrics()
    m.observe("enqueue", 0.002, 100)
    m.observe_error("release", "stale_receipt", 0.001)
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always", compaction="inline")) as engine:
        engine.enqueue("q", [NewItem(b"a"), NewItem(b"b", delay_ms=60_000)])
        m.watch_engine(lambda: engine, max_queues=200)
        s = _samples(m)
    assert s[("dq_requests_total", (("operation", "enqueue"), ("outcome", "ok")))] == 1
    assert s[("dq_requests_total", (("operation", "release"), ("outcome", "stale_receipt")))] == 1
    assert s[("dq_items_total", (("operation", "enqueue"),))] == 100
    assert s[("dq_queue_pending", (("queue", "q"),))] == 2
    assert s[("dq_queue_delayed", (("queue", "q"),))] == 1
    assert s[("dq_fsync_duration_seconds_count", ())] >= 1
    assert s[("dq_group_commits_total", (("thread", "syncer"),))] >= 1  # not a request thread


def test_apps_do_not_share_registries() -> None:
    a, b = Metrics(), Metrics()
    a.observe("dequeue", 0.001, 1)
    key = ("dq_requests_total", (("operation", "dequeue"), ("outcome", "ok")))
    assert _samples(a)[key] == 1 and _samples(b)[key] == 0


def test_per_queue_series_are_bounded(tmp_path: Path) -> None:
    """A scrape runs on the event loop: per-queue series stop at the configured count."""
    m = Metrics()
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never", compaction="inline")) as engine:
        for name in ("a", "b", "c"):
            engine.enqueue(name, [NewItem(b"x")])
        m.watch_engine(lambda: engine, max_queues=2)
        s = _samples(m)
    assert s[("dq_queues", ())] == 3
    assert [k for k in s if k[0] == "dq_queue_pending"] == [
        ("dq_queue_pending", (("queue", "a"),)),
        ("dq_queue_pending", (("queue", "b"),)),
    ]


@pytest.mark.integration
def test_group_commits_say_which_thread_ran_them(tmp_path: Path) -> None:
    """A live server with fsync=always: single enqueues over HTTP are committed by the
    event loop itself (``thread="request"``), a write from elsewhere by the syncer."""
    with live_server(tmp_path / "data", fsync="always") as server:
        with Client(server.url) as dq:
            for n in range(20):
                dq.enqueue("gc", b"v%d" % n)
            assert len(dq.dequeue("gc", count=20)) == 20
        text = httpx.get(server.url + "/metrics", timeout=10).text
    s = {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }
    # 20 writes, each answered before the next is sent. The first creates the queue, off
    # the loop (a worker thread): the syncer commits it. The other 19 are the loop's,
    # unless a slow disk made it hand some to the syncer thread.
    handed = s[("dq_group_commits_handed_back_total", ())]
    assert s[("dq_group_commits_total", (("thread", "syncer"),))] >= 1
    assert s[("dq_group_commits_total", (("thread", "request"),))] + handed >= 19
    assert s[("dq_group_commits_total", (("thread", "request"),))] >= 1 or handed >= 19


def test_a_quarantined_queue_shows_in_the_metrics(tmp_path: Path) -> None:
    """A queue's faults can be alerted on from /metrics, not only read in its stats: a
    quarantined queue is 1 in dq_queue_damaged, the healthy one 0."""
    m = Metrics()
    cfg = EngineConfig(fsync="never", compaction="inline")
    with Engine.open(tmp_path / "d", cfg) as engine:
        engine.enqueue("bad", [NewItem(b"x")])
        engine.enqueue("good", [NewItem(b"y")])
    (tmp_path / "d" / "queues" / "bad" / "queue.json").write_text("{")
    with Engine.open(tmp_path / "d", cfg) as engine:
        m.watch_engine(lambda: engine, max_queues=200)
        s = _samples(m)
    assert s[("dq_queue_damaged", (("queue", "bad"),))] == 1
    assert s[("dq_queue_failed", (("queue", "bad"),))] == 1  # it refuses work
    assert s[("dq_queue_damaged", (("queue", "good"),))] == 0
    assert s[("dq_queue_failed", (("queue", "good"),))] == 0
    assert s[("dq_queue_io_errors_total", (("queue", "good"),))] == 0
    assert s[("dq_queue_freeze_failures_total", (("queue", "good"),))] == 0
