"""Schedules in a replica group, in one process: the leader ships definitions as control
frames and ticks as ordinary records with their progress; a follower that applied them
holds the same definitions, items and progress, and, leading next, fires on from the
last tick that reached it — never one twice. The network side (pulls, etcd, a real
failover of dq serve) is ``tests/replication/test_schedules_failover.py``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine
from dq.storage.errors import NotLeader
from dq.storage.replication import KIND_CONTROL, Frame, decode_control
from dq.storage.scheduler import Scheduler
from dq.storage.schedules import ScheduleSpec
from tests.storage.conftest import FakeClock
from tests.storage.schedule_helpers import T0, Q, deadlines, items_of, run, settle
from tests.storage.shipping import AutoCommit, ListSink
from tests.storage.test_replication import _engine


@pytest.fixture
def pair(tmp_path: Path, clock: FakeClock) -> Any:
    leader = _engine(tmp_path / "leader", clock)
    follower = _engine(tmp_path / "follower", clock)
    follower.set_role(False, "http://leader")
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    yield leader, follower, sink
    auto.close()
    leader.close()
    follower.close()


def apply(follower: Engine, frames: list[Frame]) -> None:
    follower.apply(frames).result(10)


def test_a_follower_gets_definitions_ticks_and_progress(
    pair: Any, clock: FakeClock, tmp_path: Path
) -> None:
    leader, follower, sink = pair
    leader.put_schedule(Q, "beat", ScheduleSpec(every_ms=1000, value=b"v", catch_up="all"))
    leader.put_schedule(Q, "gone", ScheduleSpec(cron="0 9 * * *"))
    leader.delete_schedule(Q, "gone")
    run(Scheduler(leader), clock, T0 + 4_000)
    ops = [decode_control(f)["op"] for f in sink.frames if f.kind == KIND_CONTROL]
    assert ops == ["put_queue", "put_schedule", "put_schedule", "delete_schedule"]
    apply(follower, sink.frames)
    assert [i.schedule.name for i in follower.list_schedules(Q)] == ["beat"]
    assert follower.schedule(Q, "beat") == leader.schedule(Q, "beat")
    assert items_of(follower) == items_of(leader)
    info = follower.schedule_info(Q, "beat")
    assert (info.last_tick, info.fired) == (T0 + 4000, 4)
    # a follower fires nothing (it takes no writes)
    with pytest.raises(NotLeader):
        follower.put_schedule(Q, "other", ScheduleSpec(every_ms=1000))
    # the definitions are on the follower's disk: they survive its restart
    follower.close()
    again = _engine(tmp_path / "follower", clock)
    try:
        assert again.schedule(Q, "beat").id == leader.schedule(Q, "beat").id
        assert again.schedule_info(Q, "beat").fired == 4
    finally:
        again.close()


@pytest.mark.parametrize("reached", [True, False])
def test_the_next_leader_fires_on_without_doubling_a_tick(
    pair: Any, clock: FakeClock, reached: bool
) -> None:
    """The old leader's last tick was shipped but its outcome unknown: if the record
    reached the follower, the follower's progress has it and does not fire it again;
    if it did not, the tick was never acknowledged and the new leader fires it."""
    leader, follower, sink = pair
    leader.put_schedule(Q, "beat", ScheduleSpec(every_ms=1000, catch_up="all"))
    run(Scheduler(leader), clock, T0 + 3_000)
    frames = sink.frames if reached else sink.frames[:-1]
    apply(follower, frames)
    leader.set_role(False, "http://new-leader")  # fenced: it takes no writes
    follower.set_role(True)
    sched = Scheduler(follower)  # the new leader's term starts now
    run(sched, clock, T0 + 6_000)
    assert deadlines(follower) == [T0 + 1000 * k for k in range(1, 7)]
    assert sched.stats.fired == (3 if reached else 4)
    info = follower.schedule_info(Q, "beat")
    assert (info.last_tick, info.fired) == (T0 + 6000, 6)


def test_leading_a_new_epoch_is_a_new_term(tmp_path: Path, clock: FakeClock) -> None:
    """A leader that steps down and leads again before its scheduler looks (a new
    replicator: a new epoch) takes the ticks of the gap as missed, by ``catch_up``."""
    leader = _engine(tmp_path / "leader", clock)
    first = ListSink()
    leader.set_replication(first)
    auto = AutoCommit(leader, first)
    try:
        leader.put_schedule(Q, "beat", ScheduleSpec(every_ms=1000, catch_up="latest"))
        sched = Scheduler(leader)
        for t in (1000, 2000):
            clock.now = T0 + t
            sched._turn()
            settle(sched)
        auto.close()
        clock.now = T0 + 6_500  # meanwhile: the epoch ended, and this node leads the next
        leader.set_replication(None)
        second = ListSink()
        leader.set_replication(second)
        auto = AutoCommit(leader, second)
        sched._turn()
        settle(sched)
        assert deadlines(leader) == [T0 + 1000, T0 + 2000, T0 + 6000]
        assert sched.term == T0 + 6_500 and sched.stats.skipped == 3
    finally:
        auto.close()
        leader.close()
