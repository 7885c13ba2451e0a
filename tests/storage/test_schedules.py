"""The engine's schedule operations: definitions validated (bad ones refused naming the
field, nothing written), ``fire_schedules`` writing a tick once, ``run`` outside the
ticks. The scheduler's part: ``tests/storage/test_scheduler.py``; fire times:
``tests/storage/test_schedule_times.py``."""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from dq.storage import Engine
from dq.storage.errors import InvalidSchedule, StorageFull
from dq.storage.schedules import ScheduleSpec
from tests.storage.conftest import FakeClock
from tests.storage.faults import OneShot
from tests.storage.schedule_helpers import T0, Q, deadlines, every_second, items_of


def test_a_full_disk_refuses_the_tick_before_anything_is_written(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine(fsync="always")
    info = e.put_schedule(Q, "beat", every_second())
    clock.advance(1000)
    full = OneShot("append", "write", "log", errno.ENOSPC)
    with full.armed():
        fut, _ = e.fire_schedules(Q, [(info.schedule, [T0 + 1000])])
        assert fut is not None
        with pytest.raises(StorageFull):
            fut.result(10)
    assert e.schedule_progress(Q, info.schedule.id) is None  # given back
    fut, written = e.fire_schedules(Q, [(info.schedule, [T0 + 1000])])
    assert fut is not None and [t for _s, t in written] == [[T0 + 1000]]
    fut.result(10)
    # the same tick again writes nothing: the progress says it fired
    assert e.fire_schedules(Q, [(info.schedule, [T0 + 1000])]) == (None, [])
    assert deadlines(e) == [T0 + 1000]


def test_run_enqueues_one_now_and_leaves_the_ticks_alone(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_schedule(Q, "beat", ScheduleSpec(cron="0 9 * * *", value=b"report"))
    done, key = e.run_schedule(Q, "beat")
    assert key == f"schedule:beat:run:{clock.now}"
    assert done.deadline == clock.now
    assert items_of(e) == [(done.id, clock.now, b"report")]
    info = e.schedule_info(Q, "beat")
    assert (info.last_tick, info.fired) == (None, 0)


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        (ScheduleSpec(cron="0 9 * * *", timezone="Mars/Olympus"), "timezone", "unknown time zone"),
        (ScheduleSpec(cron="* * */20 * 1L"), "cron", "never fire"),
        (ScheduleSpec(cron="61 * * * *"), "cron", "Bad minute"),
        (ScheduleSpec(cron="* * *"), "cron", "3 fields"),
        (ScheduleSpec(every_ms=999), "every_ms", "at most every 1000 ms"),
        (ScheduleSpec(every_ms=1000, cron="* * * * *"), "cron", "exactly one"),
        (ScheduleSpec(), "cron", "exactly one"),
        (ScheduleSpec(at="2020-01-01T00:00:00Z"), "at", "time has passed"),
        (ScheduleSpec(at="tomorrow"), "at", "not an ISO 8601"),
        (ScheduleSpec(every_ms=1000, catch_up="some"), "catch_up", "catch_up must be"),
        (ScheduleSpec(every_ms=1000, end=T0 - 1), "every_ms", "end has passed"),
        (ScheduleSpec(every_ms=1000, start=T0 + 10, end=T0), "end", "end is before start"),
    ],
)
def test_bad_definitions_are_refused_naming_the_field(
    open_engine: Callable[..., Engine], spec: ScheduleSpec, field: str, words: str
) -> None:
    e = open_engine()
    with pytest.raises(InvalidSchedule) as err:
        e.put_schedule(Q, "bad", spec)
    assert err.value.context["field"] == field and words in err.value.message
    assert not e.has_queue(Q)  # nothing was written


def test_bad_schedule_names_are_refused(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    for name in (".hidden", "a/b", "x" * 101, ""):
        with pytest.raises(InvalidSchedule):
            e.put_schedule(Q, name, every_second())
