"""The scheduler on a fake clock: each tick one item (deadline = the tick, key
``schedule:{name}:{tick}``), the progress in the same record, so restarts, catch-up after
downtime, refused writes and freezes neither lose nor double a tick."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine
from dq.storage.itemmeta import read_sidecar
from dq.storage.scheduler import Scheduler
from dq.storage.schedules import ScheduleSpec, tick_key
from dq.storage.types import NewItem, QueueConfig
from tests.storage.conftest import FakeClock
from tests.storage.faults import OneShot
from tests.storage.schedule_helpers import T0, Q, deadlines, every_second, items_of, run


def test_each_tick_is_one_item_with_the_tick_as_deadline_and_key(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    info = e.put_schedule(Q, "beat", every_second())
    assert info.next == [T0 + 1000 * k for k in range(1, 6)]
    sched = Scheduler(e)
    run(sched, clock, T0 + 10_000)
    assert deadlines(e) == [T0 + 1000 * k for k in range(1, 11)]
    assert {v for _i, _d, v in items_of(e)} == {b"tick"}
    for item_id, deadline, _v in items_of(e):  # each item answers to its tick's key
        [again] = e.enqueue(Q, [NewItem(b"other", key=tick_key("beat", deadline))])
        assert (again.id, again.duplicate) == (item_id, True)
    got = e.schedule_info(Q, "beat")
    assert (got.last_tick, got.fired) == (T0 + 10_000, 10)
    assert sched.stats.fired == 10 and sched.stats.caught_up == 0


def test_progress_survives_a_restart_and_no_tick_fires_twice(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_schedule(Q, "beat", every_second(catch_up="all"))
    run(e_sched := Scheduler(e), clock, T0 + 5_000)
    assert e_sched.stats.fired == 5
    e.close()
    # the same instant again: a new term starting where the last one left off
    e2 = open_engine(path=tmp_path / "d")
    s2 = Scheduler(e2)
    run(s2, clock, T0 + 8_000)
    assert deadlines(e2) == [T0 + 1000 * k for k in range(1, 9)]
    assert e2.schedule_info(Q, "beat").fired == 8


@pytest.mark.parametrize(
    ("catch_up", "expected"),
    [
        # down from T0+3s to T0+10.5s: ticks 4..10 were missed
        ("skip", [1, 2, 3, 11, 12]),
        ("latest", [1, 2, 3, 10, 11, 12]),
        ("all", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
    ],
)
def test_catch_up_after_downtime(
    open_engine: Callable[..., Engine],
    clock: FakeClock,
    tmp_path: Path,
    catch_up: str,
    expected: list[int],
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_schedule(Q, "beat", every_second(catch_up=catch_up))
    run(Scheduler(e), clock, T0 + 3_000)
    e.close()
    clock.now = T0 + 10_500  # the server was down meanwhile
    e2 = open_engine(path=tmp_path / "d")
    s2 = Scheduler(e2)
    run(s2, clock, T0 + 12_000)
    assert deadlines(e2) == [T0 + 1000 * k for k in expected]
    missed = 7
    fired_late = {"skip": 0, "latest": 1, "all": 7}[catch_up]
    assert s2.stats.caught_up == fired_late
    assert s2.stats.skipped == missed - fired_late


def test_catch_up_all_fires_at_most_the_newest_thousand(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d", max_batch=1000)
    e.put_schedule(Q, "beat", every_second(catch_up="all"))
    e.close()
    clock.now = T0 + 1_500_000  # 1,500 ticks missed
    e2 = open_engine(path=tmp_path / "d", max_batch=1000)
    s2 = Scheduler(e2)
    s2.step()
    got = deadlines(e2)
    assert got == [T0 + 1000 * k for k in range(501, 1501)]
    assert s2.stats.skipped == 500


def test_a_refused_write_is_tried_again_and_fires_each_tick_once(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine(fsync="always")
    e.put_schedule(Q, "beat", every_second(catch_up="skip"))
    sched = Scheduler(e)
    run(sched, clock, T0 + 2_000)
    full = OneShot("append", "write", "log", errno.ENOSPC)
    with full.armed():
        run(sched, clock, T0 + 3_000)
        assert full.fired is not None
    # the queue failed with the write and reopens from its files: tick 3 was not lost
    run(sched, clock, T0 + 9_000, step_ms=100)
    assert deadlines(e) == [T0 + 1000 * k for k in range(1, 10)]
    assert sched.stats.failed_writes >= 1
    assert e.schedule_info(Q, "beat").fired == 9


def test_progress_moves_to_sidecars_and_superseded_ones_are_deleted(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_queue(Q, QueueConfig(dedup_window_ms=0))  # no key keeps a sidecar: progress does
    e.put_schedule(Q, "beat", every_second())
    sched = Scheduler(e)
    directory = Path(e.queue(Q).directory)
    for n in range(3):
        run(sched, clock, T0 + 1000 * (n + 1))
        e.freeze(Q)
    sidecars = sorted(directory.glob("*.meta"))
    assert len(sidecars) == 3
    removed = e.queue(Q).meta.prune_sidecars(str(directory), clock.now, 0, set())
    assert removed == 2
    [kept] = sorted(directory.glob("*.meta"))
    _no, meta = read_sidecar(str(kept))
    assert b"beat" in meta
    e.close()
    e2 = open_engine(path=tmp_path / "d")
    info = e2.schedule_info(Q, "beat")
    assert (info.last_tick, info.fired) == (T0 + 3000, 3)
    run(Scheduler(e2), clock, T0 + 4000)
    assert deadlines(e2) == [T0 + 1000 * k for k in range(1, 5)]


def test_pause_fires_nothing_and_resume_does_not_fire_the_paused_ticks(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_schedule(Q, "beat", every_second(catch_up="all"))
    sched = Scheduler(e)
    run(sched, clock, T0 + 2_000)
    paused = e.set_schedule_paused(Q, "beat", True)
    assert paused.schedule.paused and paused.next == []
    run(sched, clock, T0 + 6_000)
    e.set_schedule_paused(Q, "beat", False)
    run(sched, clock, T0 + 8_000)
    assert deadlines(e) == [T0 + 1000, T0 + 2000, T0 + 7000, T0 + 8000]


def test_replacing_a_definition_keeps_its_progress(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_schedule(Q, "beat", every_second())
    sched = Scheduler(e)
    run(sched, clock, T0 + 3_000)
    e.put_schedule(Q, "beat", ScheduleSpec(every_ms=2000, value=b"slower"))
    run(sched, clock, T0 + 8_000)
    got = [(d - T0, v) for _i, d, v in items_of(e)]
    assert got == [(1000, b"tick"), (2000, b"tick"), (3000, b"tick")] + [
        (t, b"slower") for t in (4000, 6000, 8000)
    ]
    assert e.schedule_info(Q, "beat").fired == 6


def test_an_at_schedule_fires_once(open_engine: Callable[..., Engine], clock: FakeClock) -> None:
    e = open_engine()
    e.put_schedule(Q, "once", ScheduleSpec(at=T0 + 5000))
    sched = Scheduler(e)
    run(sched, clock, T0 + 20_000)
    assert deadlines(e) == [T0 + 5000]
    assert e.schedule_info(Q, "once").next == []


def test_a_server_may_allow_shorter_intervals(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.min_every_ms = 100
    e.put_schedule(Q, "fast", ScheduleSpec(every_ms=250))
    run(Scheduler(e), clock, T0 + 1000, step_ms=50)
    assert deadlines(e) == [T0 + 250, T0 + 500, T0 + 750, T0 + 1000]


def test_deleting_the_queue_deletes_its_schedules(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_schedule(Q, "beat", every_second())
    sched = Scheduler(e)
    run(sched, clock, T0 + 1000)
    e.delete_queue(Q)
    run(sched, clock, T0 + 3000)
    assert not e.has_queue(Q)
    assert sched.stats.schedules == 0
