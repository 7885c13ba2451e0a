"""``dq.server.consumer_groups`` (the delivery logs) against a real engine with a test clock (no HTTP, no Spark)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.server.consumer_groups import ENTRY_COST, ConsumerGroups
from dq.server.lifespan import open_consumer_groups
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig, NewItem, Release
from tests.server.clocked import Clock

Q = "jobs"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(tmp_path: Path, clock: Clock) -> Iterator[Engine]:
    e = Engine.open(str(tmp_path / "data"), EngineConfig(fsync="never"), clock=clock)
    yield e
    e.close()


@pytest.fixture
def groups(engine: Engine, clock: Clock) -> ConsumerGroups:
    return ConsumerGroups(engine, max_batch=7, clock=clock.seconds, default_idle_timeout_ms=60_000)


def fill(engine: Engine, n: int, prefix: str = "v") -> list[int]:
    return [e.id for e in engine.enqueue(Q, [NewItem(f"{prefix}{i}".encode()) for i in range(n)])]


def test_pull_read_commit_round_trip(engine: Engine, groups: ConsumerGroups) -> None:
    ids = fill(engine, 20)
    got = groups.pull(Q, "c", after=0, max_items=15, lease_ms=10_000)
    assert (got.start, got.end, got.pulled) == (0, 15, 15)
    epoch, entries = groups.read(Q, "c", 0, 15)
    assert epoch == got.epoch
    assert [e.delivery.id for e in entries] == ids[:15]
    # replayable: a retried task reads the very same entries
    assert [e.delivery.id for e in groups.read(Q, "c", 5, 10)[1]] == ids[5:10]
    done = groups.commit(Q, "c", 15)
    assert (done.released, done.stale, done.first_unacked) == (15, 0, 15)
    assert groups.read(Q, "c", 0, 15)[1] == []
    assert engine.stats(Q).pending == 5
    # commit is idempotent
    assert groups.commit(Q, "c", 15).released == 0


def test_pull_tops_up_instead_of_pulling_again(engine: Engine, groups: ConsumerGroups) -> None:
    fill(engine, 30)
    first = groups.pull(Q, "c", after=0, max_items=10)
    again = groups.pull(Q, "c", after=0, max_items=10)  # driver crashed before recording
    assert (again.start, again.end, again.pulled) == (0, 10, 0)
    more = groups.pull(Q, "c", after=0, max_items=25)
    assert (more.end, more.pulled) == (25, 15)
    assert groups.state(Q, "c") is not None
    assert engine.stats(Q).leased == 25
    assert first.epoch == more.epoch


def test_max_new_bounds_new_leases(engine: Engine, groups: ConsumerGroups) -> None:
    fill(engine, 10)
    got = groups.pull(Q, "c", after=0, max_items=10, max_new=4)
    assert (got.end, got.pulled) == (4, 4)
    assert groups.pull(Q, "c", after=4, max_items=10, max_new=0).end == 4


def test_pull_on_missing_queue_is_empty(groups: ConsumerGroups) -> None:
    got = groups.pull("nothing-here", "c", after=3, max_items=10)
    assert (got.start, got.end, got.pulled) == (3, 3, 0)
    assert groups.queue_due("nothing-here") == 0


def test_log_behind_the_caller_jumps_forward(engine: Engine, groups: ConsumerGroups) -> None:
    """After a server restart the driver's position is ahead of a fresh log."""
    fill(engine, 5)
    got = groups.pull(Q, "c", after=120, max_items=3)
    assert (got.start, got.end) == (120, 123)
    assert groups.read(Q, "c", 0, 120) == (got.epoch, [])
    assert groups.commit(Q, "other", 50).first_unacked == 50


def test_unknown_consumer_reads_nothing(groups: ConsumerGroups) -> None:
    assert groups.read(Q, "ghost", 0, 100) == (None, [])
    assert groups.state(Q, "ghost") is None


def test_ack_and_requeue_by_sequence(engine: Engine, groups: ConsumerGroups, clock: Clock) -> None:
    ids = fill(engine, 10)
    groups.pull(Q, "c", after=0, max_items=10)
    assert groups.ack(Q, "c", [1, 3, 99]).released == 2
    st = groups.requeue(Q, "c", [0, 2], delay_ms=5_000)
    assert (st.released, st.first_unacked) == (2, 4)
    stats = engine.stats(Q)
    assert (stats.pending, stats.leased) == (8, 6)
    assert engine.dequeue(Q, count=10) == []
    clock.ms += 5_000
    back = engine.dequeue(Q, count=10)
    assert sorted(d.id for d in back) == [ids[0], ids[2]]
    assert all(d.stats.dequeue_count == 2 for d in back)
    # requeue without seqs gives back everything left
    assert groups.requeue(Q, "c", None).released == 6
    assert groups.state(Q, "c").in_flight == 0  # type: ignore[union-attr]


def test_keep_alive_extends_leases_past_their_length(
    engine: Engine, groups: ConsumerGroups, clock: Clock
) -> None:
    fill(engine, 10)
    groups.pull(Q, "c", after=0, max_items=10, lease_ms=1_000)
    for _ in range(10):  # 6 s of 1 s leases, extended every 600 ms
        clock.ms += 600
        groups.keep_alive()
        engine.expire_leases()
    assert engine.stats(Q).leased == 10
    done = groups.commit(Q, "c", 10)
    assert (done.released, done.stale) == (10, 0)
    assert engine.stats(Q).pending == 0


def test_lost_leases_leave_the_log(engine: Engine, groups: ConsumerGroups, clock: Clock) -> None:
    fill(engine, 4)
    groups.pull(Q, "c", after=0, max_items=4, lease_ms=1_000)
    clock.ms += 6_000
    engine.expire_leases()
    groups.keep_alive()
    st = groups.state(Q, "c")
    assert st is not None and (st.in_flight, st.lost) == (0, 4)
    again = engine.dequeue(Q, count=10)
    assert [d.stats.dequeue_count for d in again] == [2, 2, 2, 2]


def test_stale_receipts_count_on_commit(
    engine: Engine, groups: ConsumerGroups, clock: Clock
) -> None:
    fill(engine, 3)
    groups.pull(Q, "c", after=0, max_items=3, lease_ms=1_000)
    clock.ms += 6_000
    engine.expire_leases()
    done = groups.commit(Q, "c", 3)
    assert (done.released, done.stale) == (0, 3)
    assert engine.stats(Q).pending == 3


def test_idle_consumer_gives_items_back(
    engine: Engine, groups: ConsumerGroups, clock: Clock
) -> None:
    fill(engine, 5)
    groups.open(Q, "c", idle_timeout_ms=10_000)
    groups.pull(Q, "c", after=0, max_items=5, lease_ms=60_000)
    clock.ms += 9_000
    groups.keep_alive()
    assert groups.state(Q, "c") is not None
    clock.ms += 11_000
    groups.keep_alive()
    assert groups.state(Q, "c") is None
    assert engine.stats(Q).leased == 0
    clock.ms += 1
    assert len(engine.dequeue(Q, count=10)) == 5


def test_byte_cap_stops_pulling(engine: Engine, clock: Clock) -> None:
    groups = ConsumerGroups(engine, max_batch=4, max_log_bytes=10, clock=clock.seconds)
    engine.enqueue(Q, [NewItem(b"x" * 6) for _ in range(10)])
    got = groups.pull(Q, "c", after=0, max_items=10)
    assert 0 < got.pulled <= 4  # at most one engine batch past the cap
    assert groups.pull(Q, "c", after=got.end, max_items=10).pulled == 0
    groups.commit(Q, "c", got.end)
    assert groups.total_bytes() == 0
    assert groups.pull(Q, "c", after=got.end, max_items=10).pulled > 0


def test_delete_gives_back_and_forgets(
    engine: Engine, groups: ConsumerGroups, clock: Clock
) -> None:
    fill(engine, 3)
    groups.pull(Q, "c", after=0, max_items=3)
    assert groups.delete(Q, "c")
    assert not groups.delete(Q, "c")
    assert engine.stats(Q).leased == 0
    clock.ms += 1
    assert [d.stats.dequeue_count for d in engine.dequeue(Q, count=10)] == [2, 2, 2]
    assert [s.consumer for s in groups.consumers(Q)] == []


def test_commit_uses_the_receipt_after_extension(
    engine: Engine, groups: ConsumerGroups, clock: Clock
) -> None:
    fill(engine, 2)
    groups.pull(Q, "c", after=0, max_items=2, lease_ms=1_000)
    before = [e.receipt for e in groups.read(Q, "c", 0, 2)[1]]
    clock.ms += 3_000
    assert groups.keep_alive() == 2
    after = groups.read(Q, "c", 0, 2)[1]
    # the delivery's own receipt may be superseded; releasing with the logged one works
    assert engine.release(Q, [Release(after[0].delivery.id, after[0].receipt)])[0].ok
    assert groups.commit(Q, "c", 2).released == 1
    assert len(before) == 2


def test_consumer_leases_have_a_floor(engine: Engine, groups: ConsumerGroups) -> None:
    """Leases shorter than a few keep-alive ticks would race the expiry task."""
    from dq.server.consumer_groups import MIN_LEASE_MS

    fill(engine, 1)
    groups.pull(Q, "c", after=0, max_items=1, lease_ms=1)
    st = groups.state(Q, "c")
    assert st is not None and st.lease_ms == MIN_LEASE_MS
    entry = groups.read(Q, "c", 0, 1)[1][0]
    assert entry.lease_expires >= engine.now() + MIN_LEASE_MS


@pytest.mark.integration
def test_one_pull_stays_under_the_byte_bound(engine: Engine, clock: Clock) -> None:
    """1,000 values of 20 KiB against a 1 MiB bound: the log holds no more than the bound,
    and what it does not hold is pending again, not leased."""
    groups = ConsumerGroups(engine, max_batch=1000, max_log_bytes=1 << 20, clock=clock.seconds)
    engine.enqueue(Q, [NewItem(b"x" * 20_480) for _ in range(1000)])
    got = groups.pull(Q, "c", after=0, max_items=1000)
    assert got.pulled > 0 and got.end == got.pulled
    assert groups.total_bytes() <= 1 << 20
    stats = engine.stats(Q)
    assert (stats.leased, stats.pending) == (got.pulled, 1000)
    assert stats.due == 1000 - got.pulled  # given back at their own deadline: due now
    assert groups.pull(Q, "c", after=got.end, max_items=1000).pulled == 0


def test_empty_values_count_against_the_bound(engine: Engine, clock: Clock) -> None:
    groups = ConsumerGroups(
        engine, max_batch=1000, max_log_bytes=10 * ENTRY_COST, clock=clock.seconds
    )
    engine.enqueue(Q, [NewItem(b"") for _ in range(100)])
    got = groups.pull(Q, "c", after=0, max_items=100)
    assert got.pulled == 10
    assert groups.total_bytes() == 10 * ENTRY_COST
    st = groups.state(Q, "c")
    assert st is not None and st.bytes == 10 * ENTRY_COST
    groups.commit(Q, "c", got.end)
    assert groups.total_bytes() == 0


def test_the_bound_holds_across_consumers(engine: Engine, clock: Clock) -> None:
    groups = ConsumerGroups(engine, max_log_bytes=4 * (ENTRY_COST + 100), clock=clock.seconds)
    engine.enqueue(Q, [NewItem(b"y" * 100) for _ in range(10)])
    a = groups.pull(Q, "a", after=0, max_items=3)
    b = groups.pull(Q, "b", after=0, max_items=10)
    assert (a.pulled, b.pulled) == (3, 1)
    assert engine.stats(Q).leased == 4


def test_the_lifespan_takes_the_bound_from_settings(engine: Engine) -> None:
    settings = Settings.from_env({"DQ_CONSUMER_MAX_LOG_BYTES": str(3 * ENTRY_COST)})
    groups = open_consumer_groups(engine, settings)
    try:
        engine.enqueue(Q, [NewItem(b"") for _ in range(10)])
        assert groups.pull(Q, "c", after=0, max_items=10).pulled == 3
    finally:
        groups.close()
