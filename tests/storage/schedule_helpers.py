"""Helpers of the schedule tests: reading a queue's items back, driving the scheduler
on a fake clock."""

from __future__ import annotations

import time

from dq.storage import Engine
from dq.storage.scheduler import Scheduler
from dq.storage.schedules import ScheduleSpec
from tests.storage.conftest import FakeClock

Q = "jobs"
T0 = 1_800_000_000_000  # the fake clock's start, a whole second


def items_of(engine: Engine, queue: str = Q) -> list[tuple[int, int, bytes]]:
    """(id, deadline, value) of every live item, in key order."""
    out = []
    after = None
    while True:
        page = engine.browse(queue, "all", after=after, limit=1000, with_values=True)
        out += [(i.id, i.deadline, i.value) for i in page.items]  # type: ignore[misc]
        if page.next is None:
            return out  # type: ignore[return-value]
        after = page.next


def deadlines(engine: Engine, queue: str = Q) -> list[int]:
    return [d for _i, d, _v in items_of(engine, queue)]


def run(sched: Scheduler, clock: FakeClock, until: int, step_ms: int = 250) -> None:
    """Move the clock to ``until`` in steps, letting the scheduler fire at each and its
    writes land (``fsync="always"`` syncs them on the syncer thread)."""
    while clock.now < until:
        clock.advance(min(step_ms, until - clock.now))
        sched.step()
        settle(sched)


def settle(sched: Scheduler) -> None:
    deadline = time.monotonic() + 10
    while sched.stats.in_flight and time.monotonic() < deadline:
        time.sleep(0.002)
    assert sched.stats.in_flight == 0, "a tick's write never settled"


def every_second(catch_up: str = "latest", value: bytes = b"tick") -> ScheduleSpec:
    return ScheduleSpec(every_ms=1000, value=value, catch_up=catch_up)
