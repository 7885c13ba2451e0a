"""The dashboard's history rings: bounded in time and in queues, sums over all queues."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dq.server.history import FIELDS, History, Sample
from dq.storage import Engine, EngineConfig, NewItem


def sample(due: int, rate: float = math.nan) -> Sample:
    return Sample(due, 1, 2, rate, rate, rate)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_ring_keeps_only_the_retention() -> None:
    clock = Clock()
    h = History(interval_s=1, retention_s=10, clock=clock)
    for n in range(25):
        clock.now += 1
        h.record(int(clock.now * 1000), {"a": sample(n)})
    s = h.series("a", 3600)
    assert s["due"] == list(range(15, 25))  # the 10 newest, oldest first
    assert s["t"] == sorted(s["t"]) and len(s["t"]) == 10
    assert h.series("a", 2.5)["due"] == [22, 23, 24]


def test_all_queues_are_summed_and_unknown_rates_are_null() -> None:
    clock = Clock()
    h = History(interval_s=1, retention_s=60, clock=clock)
    h.record(int(clock.now * 1000), {"a": sample(3), "b": sample(4)})
    total = h.series(None, 60)
    assert total["due"] == [7] and total["delayed"] == [2] and total["leased"] == [4]
    assert total["enqueue_per_s"] == [None]
    h.record(int(clock.now * 1000) + 1, {"a": sample(3, 1.5), "b": sample(4, 2.0)})
    assert h.series(None, 60)["release_per_s"] == [None, 3.5]
    assert set(FIELDS) <= set(total)


def test_per_queue_rings_are_capped_to_the_busiest() -> None:
    clock = Clock()
    h = History(interval_s=1, retention_s=60, max_queues=3, clock=clock)
    samples = {f"q{n}": sample(n) for n in range(10)}
    h.record(int(clock.now * 1000), samples)
    assert set(h.queues) == {"q7", "q8", "q9"}
    assert h.series("q2", 60)["tracked"] is False
    assert h.series(None, 60)["due"] == [sum(range(10))]  # untracked ones still count
    # A queue that becomes busier takes the place of the least busy one.
    samples["q0"] = sample(100)
    h.record(int(clock.now * 1000) + 1, samples)
    assert set(h.queues) == {"q0", "q8", "q9"}
    # Ties keep the queue that is already tracked.
    samples = {f"q{n}": sample(5) for n in range(10)}
    h.record(int(clock.now * 1000) + 2, samples)
    assert set(h.queues) == {"q0", "q8", "q9"}
    assert h.describe()["tracked_queues"] == 3


def test_deleted_queues_lose_their_ring() -> None:
    h = History(interval_s=1, retention_s=60)
    h.record(1, {"a": sample(1), "b": sample(1)})
    h.record(2, {"a": sample(1)})
    assert set(h.queues) == {"a"}


def test_memory_is_fixed_by_the_bounds() -> None:
    h = History(interval_s=5, retention_s=3600, max_queues=100)
    for n in range(3):
        h.record(n, {f"q{i}": sample(i) for i in range(1000)})
    assert len(h.queues) == 100
    ring = next(iter(h.queues.values()))
    assert ring.slots == 720 and all(len(col) == 720 for col in ring.cols)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        History(interval_s=0)
    with pytest.raises(ValueError):
        History(interval_s=10, retention_s=5)


def test_sample_reads_the_engine(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never")) as engine:
        engine.enqueue("a", [NewItem(b"x"), NewItem(b"y", delay_ms=600_000)])
        engine.dequeue("a", 1)
        engine.enqueue("b", [NewItem(b"z")])
        h = History(interval_s=1, retention_s=60)
        h.sample(engine)
        a = h.series("a", 60)
        assert (a["due"], a["delayed"], a["leased"]) == ([0], [1], [1])
        assert h.series(None, 60)["due"] == [1]


def test_slow_sampling_backs_off() -> None:
    """A round that takes 20 ms with a 10 ms interval is followed by a 180 ms pause."""

    class SlowEngine:
        def list_queues(self) -> list[str]:
            return ["a"]

        def stats(self, name: str) -> SimpleNamespace:
            time.sleep(0.02)
            return SimpleNamespace(due=1, delayed=0, leased=0)

    h = History(interval_s=0.01, retention_s=60)

    async def run_for(seconds: float) -> None:
        task = asyncio.create_task(h.run(SlowEngine()))  # type: ignore[arg-type]
        await asyncio.sleep(seconds)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(run_for(1.0))
    assert 2 <= len(h.series(None, 60)["t"]) <= 6  # about 5; 50 without the back-off
