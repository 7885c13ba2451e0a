"""Fire times: cron in a zone's wall clock across both daylight-saving changes, intervals,
one-off times. The Berlin cases run the real scheduler on a fake clock through the
days around each change and read the items' deadlines back on Berlin's wall clock."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dq.storage import Engine
from dq.storage.errors import InvalidSchedule
from dq.storage.schedule_times import (
    from_ms,
    make_timing,
    next_after,
    parse_time,
    ticks_between,
    upcoming,
    wall_to_instant,
    zone,
)
from dq.storage.scheduler import Scheduler
from dq.storage.schedules import ScheduleSpec
from tests.storage.conftest import FakeClock

BERLIN = zone("Europe/Berlin")


def ms(text: str) -> int:
    """An instant written with its offset."""
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def berlin(instant: int) -> str:
    return from_ms(instant, BERLIN).isoformat(timespec="minutes")


def fire_times(
    open_engine: Callable[..., Engine], clock: FakeClock, cron: str, start: str, end: str
) -> list[str]:
    """Create the schedule at ``start``, run the scheduler to ``end`` jumping from one
    due time to the next, and give every item's deadline on Berlin's wall clock."""
    clock.now = ms(start)
    e = open_engine()
    e.put_schedule("q", "s", ScheduleSpec(cron=cron, timezone="Europe/Berlin"))
    sched = Scheduler(e)
    stop = ms(end)
    nxt = sched.step()
    while nxt is not None and nxt <= stop:
        clock.now = nxt
        nxt = sched.step()
    page = e.browse("q", "all", limit=1000)
    assert page.next is None
    return [berlin(i.deadline) for i in page.items]  # type: ignore[arg-type]


def test_daily_at_0230_in_berlin_across_spring_forward(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    # 29 March 2026: 02:00 CET jumps to 03:00 CEST; 02:30 does not exist that day
    got = fire_times(
        open_engine, clock, "30 2 * * *", "2026-03-27T12:00+01:00", "2026-03-31T12:00+02:00"
    )
    assert got == [
        "2026-03-28T02:30+01:00",
        "2026-03-29T03:00+02:00",  # once, at the next valid instant
        "2026-03-30T02:30+02:00",
        "2026-03-31T02:30+02:00",
    ]


def test_daily_at_0230_in_berlin_across_fall_back(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    # 25 October 2026: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice
    got = fire_times(
        open_engine, clock, "30 2 * * *", "2026-10-23T12:00+02:00", "2026-10-27T12:00+01:00"
    )
    assert got == [
        "2026-10-24T02:30+02:00",
        "2026-10-25T02:30+02:00",  # once, at the first
        "2026-10-26T02:30+01:00",
        "2026-10-27T02:30+01:00",
    ]


def test_every_half_hour_in_berlin_across_both_changes(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    spring = fire_times(
        open_engine, clock, "*/30 * * * *", "2026-03-29T01:10+01:00", "2026-03-29T04:10+02:00"
    )
    assert spring == [
        "2026-03-29T01:30+01:00",
        "2026-03-29T03:00+02:00",  # 02:00, 02:30 and 03:00 are one tick
        "2026-03-29T03:30+02:00",
        "2026-03-29T04:00+02:00",
    ]


def test_every_half_hour_in_berlin_across_fall_back(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    autumn = fire_times(
        open_engine, clock, "*/30 * * * *", "2026-10-25T01:10+02:00", "2026-10-25T04:10+01:00"
    )
    assert autumn == [
        "2026-10-25T01:30+02:00",
        "2026-10-25T02:00+02:00",
        "2026-10-25T02:30+02:00",
        # the repeated 02:00 and 02:30 (CET) fire nothing
        "2026-10-25T03:00+01:00",
        "2026-10-25T03:30+01:00",
        "2026-10-25T04:00+01:00",
    ]


def test_weekdays_at_nine_in_berlin_keep_the_wall_clock(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    got = fire_times(
        open_engine, clock, "0 9 * * MON-FRI", "2026-10-22T12:00+02:00", "2026-10-28T12:00+01:00"
    )
    assert got == [
        "2026-10-23T09:00+02:00",  # Friday; the weekend fires nothing
        "2026-10-26T09:00+01:00",  # an hour later in UTC, 09:00 on the wall
        "2026-10-27T09:00+01:00",
        "2026-10-28T09:00+01:00",
    ]


def test_six_fields_put_the_seconds_first() -> None:
    t = make_timing(cron="30 0 9 * * *", timezone="UTC", now=ms("2026-01-01T00:00+00:00"))
    assert upcoming(t, ms("2026-01-01T00:00+00:00"), 2) == [
        ms("2026-01-01T09:00:30+00:00"),
        ms("2026-01-02T09:00:30+00:00"),
    ]


def test_intervals_ignore_the_wall_clock_and_align_to_start_or_the_epoch() -> None:
    t = make_timing(every_ms=3_600_000, timezone="Europe/Berlin", now=0)
    got = upcoming(t, ms("2026-03-29T00:30+01:00"), 4)
    assert [b - a for a, b in itertools.pairwise(got)] == [3_600_000] * 3
    assert got[0] == ms("2026-03-29T01:00+01:00")
    shifted = make_timing(every_ms=60_000, start=1_000, now=0)
    assert upcoming(shifted, 0, 2) == [1_000, 61_000]


def test_at_and_start_end_read_local_times_in_the_zone() -> None:
    now = ms("2026-01-01T00:00+00:00")
    t = make_timing(at="2026-12-01T09:00:00", timezone="Europe/Berlin", now=now)
    assert t.at == ms("2026-12-01T09:00+01:00")
    assert make_timing(at="2026-12-01T09:00:00Z", now=now).at == ms("2026-12-01T09:00+00:00")
    # a local time that does not exist starts at the next valid instant
    assert parse_time("2026-03-29T02:30", "Europe/Berlin", "start") == ms("2026-03-29T03:00+02:00")
    bounded = make_timing(
        every_ms=1000, start=now + 5000, end=now + 7000, now=now
    )  # start and end included
    assert upcoming(bounded, now, 10) == [now + 5000, now + 6000, now + 7000]


def test_wall_times_map_to_the_first_occurrence_or_after_the_gap() -> None:
    assert wall_to_instant(datetime(2026, 10, 25, 2, 30), BERLIN) == ms("2026-10-25T02:30+02:00")
    assert wall_to_instant(datetime(2026, 3, 29, 2, 30), BERLIN) == ms("2026-03-29T03:00+02:00")
    lord_howe = zone("Australia/Lord_Howe")  # a 30-minute change
    assert wall_to_instant(datetime(2026, 10, 4, 2, 10), lord_howe) == ms("2026-10-04T02:30+11:00")


def test_a_cron_that_never_fires_is_refused() -> None:
    with pytest.raises(InvalidSchedule, match="never fire"):
        make_timing(cron="* * */20 * 1L", now=0)


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "UTC", "Asia/Kolkata"]
CRONS = ["*/30 * * * *", "30 2 * * *", "0 * * * *", "15 1-3 * * SUN", "*/20 * * * * *"]


@settings(max_examples=150, deadline=None)
@given(
    tz=st.sampled_from(ZONES),
    cron=st.sampled_from(CRONS),
    # days around 2026's changes in both hemispheres, and any other
    start=st.integers(ms("2026-03-27T00:00+00:00"), ms("2026-11-03T00:00+00:00")),
    span=st.integers(0, 6 * 3600 * 1000),
)
def test_looking_back_finds_exactly_what_looking_forward_does(
    tz: str, cron: str, start: int, span: int
) -> None:
    """Catch-up looks back from now (``ticks_between``); the scheduler looks forward
    (``next_after``): both must name the same ticks, daylight-saving changes included,
    strictly increasing."""
    t = make_timing(cron=cron, timezone=tz, now=0)
    forward: list[int] = []
    tick = next_after(t, start)
    while tick is not None and tick <= start + span and len(forward) < 60:
        forward.append(tick)
        tick = next_after(t, tick)
    if len(forward) == 60:
        return
    back, older = ticks_between(t, start, start + span, 60)
    assert back == forward and older == 0
    assert all(a < b for a, b in itertools.pairwise(forward))
