"""bench/schedules.py's own parts, checked without running the benchmark (it needs a
quiet machine): the data directory it makes holds valid schedules the engine and the
scheduler take, and its percentile reads a cumulative histogram the way /metrics has it."""

from __future__ import annotations

import math
from pathlib import Path

from bench.schedules import make_data_dir, percentile
from dq.storage import Engine, EngineConfig
from dq.storage.scheduler import Scheduler


def test_the_data_directory_holds_schedules_the_scheduler_takes(tmp_path: Path) -> None:
    make_data_dir(tmp_path / "d", queues=3, schedules=30)
    engine = Engine.open(tmp_path / "d", EngineConfig(fsync="never", compaction="inline"))
    try:
        assert engine.list_queues() == ["jobs-000", "jobs-001", "jobs-002"]
        infos = [i for q in engine.list_queues() for i in engine.list_schedules(q)]
        assert len(infos) == 30 and all(len(i.next) == 5 for i in infos)
        assert {i.schedule.timing.timezone for i in infos} == {"UTC", "Europe/Berlin"}
        scheduler = Scheduler(engine)
        scheduler.begin_term(engine.now())
        assert scheduler.stats.schedules == 30
    finally:
        engine.close()


def test_percentile_is_the_bound_of_the_bucket_holding_it() -> None:
    before = {0.005: 10.0, 0.01: 10.0, 0.05: 10.0, math.inf: 10.0}
    after = {0.005: 60.0, 0.01: 108.0, 0.05: 110.0, math.inf: 110.0}  # 100 new: 50, 48, 2
    assert percentile(before, after, 0.50) == 0.005
    assert percentile(before, after, 0.98) == 0.01
    assert percentile(before, after, 0.99) == 0.05
