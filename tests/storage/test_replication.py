"""The engine's part in a replica group, driven in one process: a leader engine ships
to a list, follower engines apply what it shipped (or a copy of it), and both must then
hold the same queues, items, configs and pause states — before and after a restart.

The network side (pulls, acknowledgements, etcd) is tested in ``tests/replication``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from dq.storage import (
    Engine,
    EngineConfig,
    Fail,
    NewItem,
    QueueConfig,
    Release,
    Requeue,
    RetryPolicy,
)
from dq.storage.errors import (
    CorruptionError,
    InvalidArgument,
    NotLeader,
    ReplicationStalled,
    ReplicationTimeout,
)
from dq.storage.replication import (
    KIND_CONTROL,
    KIND_RECORD,
    Frame,
    decode_frames,
    encode_frame,
)
from tests.storage.shipping import AutoCommit, ListSink


def _engine(path: Path, clock: Any, **overrides: Any) -> Engine:
    cfg = EngineConfig(
        **{"fsync": "always", "compaction": "inline", "auto_merge": False, **overrides}
    )
    return Engine.open(path, cfg, clock=clock)


def _items(engine: Engine, name: str) -> list[tuple[int, int, bytes]]:
    """(id, deadline, value) of every item in the queue, leased or not."""
    return [(i, d, v) for i, d, v, _e in _items_and_reasons(engine, name)]


def _items_and_reasons(engine: Engine, name: str) -> list[tuple[int, int, bytes, Any]]:
    """(id, deadline, value, reasons) of every item in the queue, leased or not."""
    out = []
    after = None
    for _ in range(1000):
        page = engine.browse(name, "all", after=after, limit=500, with_values=True)
        out += [(i.id, i.deadline, i.value, i.errors) for i in page.items]
        if page.next is None:
            return out
        after = page.next
    raise AssertionError("browse did not end")


def _state(engine: Engine) -> dict[str, Any]:
    return {
        name: (
            engine.get_queue(name),
            engine.queue(name).state.paused,
            _items_and_reasons(engine, name),
        )
        for name in engine.list_queues()
    }


# ---------------------------------------------------------------------- frames


def test_frames_round_trip_and_damage_is_refused() -> None:
    frames = [
        Frame(1, "jobs", KIND_RECORD, b"\x00" * 16),
        Frame(2, "jobs", KIND_CONTROL, b'{"op":"delete_queue"}'),
    ]
    data = b"".join(encode_frame(f) for f in frames)
    assert decode_frames(data) == frames
    bad = bytearray(data)
    bad[30] ^= 0xFF
    with pytest.raises(CorruptionError, match="checksum"):
        decode_frames(bytes(bad))
    with pytest.raises(CorruptionError):
        decode_frames(data[:-1])
    unknown = bytearray(encode_frame(Frame(3, "q", 9, b"")))
    import zlib

    unknown[4:8] = zlib.crc32(bytes(unknown[8:])).to_bytes(4, "big")
    with pytest.raises(CorruptionError, match="kind"):
        decode_frames(bytes(unknown))


# ---------------------------------------------------------------------- leader


def test_leader_answers_and_publishes_only_once_committed(engines: Any) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    fut = leader.enqueue_nowait("jobs", [NewItem(b"a", 0)])
    time.sleep(0.2)  # long enough for the local fsync
    assert not fut.done()
    assert leader.dequeue("jobs", 10) == []  # not committed: not visible
    leader.commit(sink.last - 1)  # the queue's creation only
    assert not fut.done()
    leader.commit(sink.last)
    [got] = fut.result(timeout=5)
    [d] = leader.dequeue("jobs", 10)
    assert (d.id, d.value) == (got.id, b"a")


def test_commit_timeout_answers_unknown_and_the_write_still_lands(engines: Any) -> None:
    leader = engines("leader")
    sink = ListSink(commit_timeout_s=0.1)
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    leader.ensure_queue("jobs")
    auto.close()
    fut = leader.enqueue_nowait("jobs", [NewItem(b"late", 0)])
    deadline = time.monotonic() + 5
    while not fut.done() and time.monotonic() < deadline:
        leader.commit(0)  # the replicator's tick
        time.sleep(0.02)
    with pytest.raises(ReplicationTimeout):
        fut.result(timeout=0)
    assert leader.dequeue("jobs", 10) == []
    leader.commit(sink.last)  # the acknowledgements arrive after all
    [d] = leader.dequeue("jobs", 10)
    assert d.value == b"late"


def test_stopping_to_lead_answers_waiting_writes_unknown(engines: Any) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    leader.enqueue("jobs", [NewItem(b"committed", 0)])
    auto.close()
    fut = leader.enqueue_nowait("jobs", [NewItem(b"in doubt", 0)])
    leader.set_replication(None)  # leadership lost before the sync set answered
    with pytest.raises(ReplicationTimeout, match="unknown"):
        fut.result(timeout=5)
    leader.set_replication(ListSink())  # a new epoch numbers from 1 again
    leader.commit(10)
    assert [d.value for d in leader.dequeue("jobs", 10)] == [b"committed"]


def test_leading_again_after_a_step_down_restores_the_writes_in_doubt(engines: Any) -> None:
    """A leader that steps down and wins the next election itself (no other member
    could) serves what its log holds: the write in doubt is an item with its id, and
    a repeat of its idempotency key finds it instead of making a second item."""
    leader = engines("leader")
    leader.put_queue("jobs", QueueConfig(dedup_window_ms=60_000))
    sink = ListSink()
    leader.set_replication(sink)
    fut = leader.enqueue_nowait("jobs", [NewItem(b"in doubt", 0, key="k")])
    leader.queue("jobs")  # the write reaches the log (fsync) but never the sync set
    deadline = time.monotonic() + 5
    while leader.queue("jobs").commit.waiting and not leader.queue("jobs").commit.waiting[0].synced:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    leader.set_replication(None)  # the lease is lost
    with pytest.raises(ReplicationTimeout):
        fut.result(timeout=5)
    assert leader.restore_dropped() == ["jobs"]
    again = ListSink()
    leader.set_replication(again)  # a new epoch
    auto = AutoCommit(leader, again)
    try:
        [dup] = leader.enqueue("jobs", [NewItem(b"repeat", 0, key="k")])
    finally:
        auto.close()
    assert [(d.id, d.value) for d in leader.dequeue("jobs", 10)] == [(dup.id, b"in doubt")]
    assert leader.restore_dropped() == []


def test_a_keyed_write_answered_unknown_keeps_its_key(engines: Any) -> None:
    """A repeat of a key whose write timed out waiting for the sync set is answered
    "unknown" too (never a second item); once the first write commits, the repeat
    answers its id."""
    leader = engines("leader")
    leader.put_queue("jobs", QueueConfig(dedup_window_ms=60_000))
    sink = ListSink(commit_timeout_s=0.05)
    leader.set_replication(sink)
    fut = leader.enqueue_nowait("jobs", [NewItem(b"first", 0, key="k")])
    deadline = time.monotonic() + 5
    while not fut.done():
        assert time.monotonic() < deadline
        leader.commit(0)  # the replicator's tick
        time.sleep(0.02)
    with pytest.raises(ReplicationTimeout):
        fut.result()
    with pytest.raises(ReplicationTimeout):
        leader.enqueue_nowait("jobs", [NewItem(b"repeat", 0, key="k")]).result(timeout=5)
    leader.commit(sink.last)  # the acknowledgements arrive after all
    [dup] = leader.enqueue_nowait("jobs", [NewItem(b"repeat", 0, key="k")]).result(timeout=5)
    assert dup.duplicate
    assert [(d.id, d.value) for d in leader.dequeue("jobs", 10)] == [(dup.id, b"first")]


def test_a_stalled_group_refuses_writes_before_writing_them(engines: Any) -> None:
    leader = engines("leader")
    leader.put_queue("jobs", QueueConfig(dedup_window_ms=60_000))
    leader.enqueue("jobs", [NewItem(b"before", 0)])
    got = leader.dequeue("jobs", 1)
    sink = ListSink()
    leader.set_replication(sink)
    sink.admitting = False  # the sync set has acknowledged nothing for a commit timeout
    shipped = sink.last
    for call in (
        lambda: leader.enqueue_nowait("jobs", [NewItem(b"x", 0)]),
        lambda: leader.enqueue_nowait("jobs", [NewItem(b"x", 0, key="k")]),
        lambda: leader.release_nowait("jobs", [Release(got[0].id, got[0].receipt)]),
    ):
        with pytest.raises(ReplicationStalled) as err:
            call()
        assert err.value.http_status == 503
    assert sink.last == shipped  # nothing was written or shipped
    sink.admitting = True
    auto = AutoCommit(leader, sink)
    try:  # nothing was left behind: the lease, the key and the barrier are as before
        leader.release("jobs", [Release(got[0].id, got[0].receipt)])
        [new] = leader.enqueue("jobs", [NewItem(b"y", 0, key="k")])
        assert not new.duplicate
    finally:
        auto.close()
    assert [d.value for d in leader.dequeue("jobs", 10)] == [b"y"]


def test_a_delete_refused_by_a_stall_leaves_the_fair_turns_as_they_were(engines: Any) -> None:
    """With ``fair``, a delete of a group's only item refused by a stalled replica group
    changes nothing: the group keeps its turn (it used to lose it, and the items without
    a group were served twice in a row while it waited)."""
    leader = engines("leader")
    leader.put_queue("jobs", QueueConfig(fair=True))
    leader.enqueue("jobs", [NewItem(b"n1"), NewItem(b"n2")])
    [a1] = leader.enqueue("jobs", [NewItem(b"a1", group="a")])
    assert [d.value for d in leader.dequeue("jobs", 1)] == [b"n1"]  # a's turn is next
    sink = ListSink()
    leader.set_replication(sink)
    sink.admitting = False
    with pytest.raises(ReplicationStalled):
        leader.delete_item("jobs", a1.id)
    sink.admitting = True
    auto = AutoCommit(leader, sink)
    try:
        assert [(d.value, d.group) for d in leader.dequeue("jobs", 1)] == [(b"a1", "a")]
        assert [d.value for d in leader.dequeue("jobs", 1)] == [b"n2"]
    finally:
        auto.close()


def test_a_replaced_sinks_commit_publishes_nothing(engines: Any) -> None:
    """The fence inside the engine: the previous epoch's replicator, still ticking,
    cannot publish the next epoch's records (both number from 1)."""
    leader = engines("leader")
    leader.ensure_queue("jobs")
    old, new = ListSink(), ListSink()
    leader.set_replication(new)
    fut = leader.enqueue_nowait("jobs", [NewItem(b"epoch 2", 0)])
    time.sleep(0.2)  # synced locally
    leader.commit(100, old)
    assert not fut.done() and leader.dequeue("jobs", 1) == []
    leader.commit(new.last, new)
    fut.result(timeout=5)


def test_a_dead_letter_move_refused_by_a_stall_is_retried(engines: Any, clock: Any) -> None:
    """An item past its deliveries leaves its queue's view for the dead-letter queue;
    if the group refuses the move (a stall), the move is retried until it lands
    (it must not wait for a restart)."""
    leader = engines("leader")
    leader.put_queue("jobs", QueueConfig(max_deliveries=1, dead_letter_queue="dlq"))
    leader.ensure_queue("dlq")
    leader.enqueue("jobs", [NewItem(b"poison", 0)])
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    try:
        [d] = leader.dequeue("jobs", 1, 1000)
        clock.advance(2000)
        leader.expire_leases("jobs")  # delivered once: the next look moves it
        deadline = time.monotonic() + 10
        while leader.queue("jobs").commit.waiting:  # the expiry's record commits
            assert time.monotonic() < deadline
            time.sleep(0.01)
        sink.admitting = False  # the group acknowledges nothing: the move is refused
        assert leader.dequeue("jobs", 1, 1000) == []
        leader.expire_leases("jobs")
        assert _items(leader, "dlq") == []
        sink.admitting = True
        deadline = time.monotonic() + 10
        while not _items(leader, "dlq"):
            assert time.monotonic() < deadline, "the move was never retried"
            time.sleep(0.05)
    finally:
        auto.close()
    assert [v for _i, _d, v in _items(leader, "dlq")] == [b"poison"]
    assert d.value == b"poison"
    assert leader.dequeue("jobs", 1, 1000) == []


def test_replication_needs_fsync_always(engines: Any) -> None:
    e = engines("interval", fsync="interval")
    with pytest.raises(InvalidArgument, match="always"):
        e.set_replication(ListSink())


def test_local_failure_is_reported_to_the_sink(engines: Any) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    try:
        leader.enqueue("jobs", [NewItem(b"x", 0)])
        q = leader.queue("jobs")
        with q.lock:
            q.failing.fail(OSError(5, "Input/output error"), "syncing the log")
    finally:
        auto.close()
    assert sink.failures == ["jobs"]


# ---------------------------------------------------------------------- follower


def _busy_leader(leader: Engine, sink: ListSink, clock: Any) -> None:
    """Every kind of write a follower must reproduce."""
    now = clock()
    leader.put_queue("mail", QueueConfig(default_lease_ms=5000, dedup_window_ms=60_000))
    leader.enqueue("mail", [NewItem(b"m%d" % i, now - 100 + i) for i in range(50)])
    leader.enqueue("mail", [NewItem(b"keyed", now, key="k-1")])
    got = leader.dequeue("mail", 5, 1000)
    leader.release("mail", [Release(d.id, d.receipt) for d in got[:2]])
    leader.requeue("mail", [Requeue(got[2].id, got[2].receipt, deadline=now + 10_000)])
    leader.fail("mail", [Fail(got[3].id, got[3].receipt, "ValueError: bad address")])
    leader.enqueue("jobs", [NewItem(b"j", 0)])
    leader.pause("jobs")
    leader.put_queue("gone", QueueConfig())
    leader.enqueue("gone", [NewItem(b"g", 0)])
    leader.delete_queue("gone")
    leader.purge("jobs")
    leader.enqueue("jobs", [NewItem(b"after purge", 0)])


def test_a_follower_applying_the_stream_holds_what_the_leader_holds(
    engines: Any, clock: Any, tmp_path: Path
) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    try:
        _busy_leader(leader, sink, clock)
    finally:
        auto.close()
    follower = engines("follower")
    follower.set_role(False, "http://leader:1")
    follower.apply(sink.frames).result(timeout=10)
    assert _state(follower) == _state(leader)
    failed = [e for _i, _d, _v, e in _items_and_reasons(follower, "mail") if e]
    assert [[r.error for r in e] for e in failed] == [["ValueError: bad address"]]
    assert {f.kind for f in sink.frames} >= {KIND_RECORD, KIND_CONTROL}

    # the follower's copy survives a restart (it is in its logs, not just in memory)
    follower.close()
    again = engines("follower")
    assert _state(again) == _state(leader)
    # promoted, it keeps dedup keys and never reuses an id
    dup = again.enqueue("mail", [NewItem(b"other", 0, key="k-1")])
    assert dup[0].id == next(i for i, _d, v in _items(leader, "mail") if v == b"keyed")
    [new] = again.enqueue("mail", [NewItem(b"new", 0)])
    assert new.id > max(i for i, _d, _v in _items(leader, "mail"))


def test_a_follower_refuses_client_writes_but_reads(engines: Any) -> None:
    e = engines("follower")
    e.enqueue("jobs", [NewItem(b"x", 0)])
    e.set_role(False, "http://leader:8080")
    for call in (
        lambda: e.enqueue_nowait("jobs", [NewItem(b"y", 0)]),
        lambda: e.dequeue("jobs", 1),
        lambda: e.release_nowait("jobs", [Release(1, "r")]),
        lambda: e.put_queue("jobs", QueueConfig()),
        lambda: e.delete_queue("jobs"),
        lambda: e.pause("jobs"),
        lambda: e.purge("jobs"),
        lambda: e.ensure_queue("new"),
    ):
        with pytest.raises(NotLeader) as err:
            call()
        assert err.value.leader == "http://leader:8080"
        assert err.value.http_status == 421
    assert e.stats("jobs").pending == 1
    assert [v for _i, _d, v in _items(e, "jobs")] == [b"x"]
    e.set_role(True)
    e.enqueue("jobs", [NewItem(b"z", 0)])


def test_snapshot_then_stream_converges_while_writes_go_on(
    engines: Any, clock: Any, tmp_path: Path
) -> None:
    # small logs, so the copy holds segment files, closed logs and a live log
    leader = engines("leader", memseg_bytes=8 << 10)
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    try:
        _busy_leader(leader, sink, clock)
        for i in range(20):
            leader.enqueue("bulk", [NewItem(os.urandom(200), clock() + i) for _ in range(20)])
        start = sink.last
        dest = os.path.join(leader.root, ".replica-test")
        lsns = leader.snapshot(dest)
        # writes go on while the copy travels
        leader.enqueue("bulk", [NewItem(b"during", 0)])
        leader.put_queue("fresh", QueueConfig())
        leader.enqueue("fresh", [NewItem(b"f", 0)])
    finally:
        auto.close()
    assert any(n.endswith(".seg") for n in os.listdir(os.path.join(dest, "queues", "bulk")))
    follower = engines("follower")
    follower.set_role(False, None)
    follower.replace_queues(dest)
    todo = [f for f in sink.frames if f.lsn > lsns.get(f.queue, start)]
    follower.apply(todo).result(timeout=10)
    assert _state(follower) == _state(leader)
    follower.close()
    assert _state(engines("follower")) == _state(leader)


def test_a_crash_between_the_renames_of_a_replacement_keeps_the_old_queues(
    engines: Any, tmp_path: Path, clock: Any
) -> None:
    e = engines("node")
    e.enqueue("jobs", [NewItem(b"kept", 0)])
    e.close()
    root = tmp_path / "node"
    # the state replace_queues leaves if the process dies after its first rename
    os.rename(root / "queues", root / ".replica-old-1700000000000000000")
    (root / ".replica-copy-1").mkdir()  # the copy being installed: scratch, removed
    again = engines("node")
    assert [v for _i, _d, v in _items(again, "jobs")] == [b"kept"]
    assert sorted(os.listdir(root)) == ["LOCK", "queues"]


def test_a_follower_that_takes_over_delivers_an_expired_lease_first_of_its_group(
    engines: Any, clock: Any
) -> None:
    """With ``group_limit`` 1 and a retry delay, the leader writes a1 back after its
    lease ran out, later than a2: a follower that applied that record and starts to
    lead holds a2 back for a1, as the leader would (``docs/delivery.md``, "An expired
    lease's place"); so does the follower restarted before it leads."""
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    auto = AutoCommit(leader, sink)
    retry = RetryPolicy(delays_ms=(2000,))
    try:
        leader.put_queue("q", QueueConfig(group_limit=1, retry=retry))
        leader.enqueue("q", [NewItem(b"a1", 0, group="a"), NewItem(b"a2", 0, group="a")])
        [a1] = leader.dequeue("q", 1, 1000)
        clock.advance(1500)
        assert leader.expire_leases("q") == 1
        deadline = time.monotonic() + 10
        while leader.queue("q").commit.waiting:  # the expiry's record commits
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        auto.close()
    for restarted in (False, True):
        follower = engines("follower")
        follower.set_role(False, "http://leader:1")
        if not restarted:
            follower.apply(sink.frames).result(timeout=10)
        follower.set_role(True)
        assert follower.dequeue("q", 2, 1000) == []  # a2 waits for a1
        follower.close()
    clock.advance(2000)
    again = engines("follower")
    got = again.dequeue("q", 2, 1000)
    assert [(d.id, d.value) for d in got] == [(a1.id, b"a1")]
