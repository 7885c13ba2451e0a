"""A replica group's leader engine under trouble: what it answers, and what it must not
do before the node steps down.

- A queue change waiting for the sync set must not hold the engine's lock: the node
  swaps the sink (``set_replication``) on its event loop when it stops leading, and a
  follower's snapshot lists the queues under that lock.
- A write whose record was shipped but whose local fsync failed may be on the followers
  (and commit there): its answer must be "unknown" (503 ``replication_timeout``), never a
  refusal, which promises the write did not happen.
- A queue that failed on the leader and reopens before its node has stepped down cuts
  its log back below what the followers hold: a write it takes then must not reuse the
  id of the record the followers already have.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release, fileio
from dq.storage.errors import ReplicationTimeout, StorageError
from dq.storage.replication import KIND_CONTROL
from tests.storage.shipping import ListSink


def _wait_for(pred: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.005)


class FailFsync:
    """A ``fileio.FAULTS`` hook: EIO on the first sync of the live log of ``queue``."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.fired = False

    def __call__(self, step: str, path: str) -> None:
        if self.fired or step != "fsync" or not path.endswith(".log"):
            return
        if f"{os.sep}{self.queue}{os.sep}" not in path:
            return
        self.fired = True
        raise OSError(errno.EIO, os.strerror(errno.EIO), path)


def test_a_queue_creation_waiting_for_its_commit_blocks_no_step_down(
    engines: Any, tmp_path: Path
) -> None:
    leader = engines("leader")
    sink = ListSink(commit_timeout_s=8.0)  # the sync set never answers
    leader.set_replication(sink)
    outcome: list[BaseException | None] = []

    def create() -> None:
        try:
            leader.put_queue("fresh", QueueConfig())
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    t = threading.Thread(target=create, daemon=True)
    t.start()
    _wait_for(lambda: any(f.kind == KIND_CONTROL and f.queue == "fresh" for f in sink.frames))
    time.sleep(0.1)  # well inside the wait for the commit

    # a follower's snapshot meanwhile (it lists the queues under the engine lock)
    dest = tmp_path / "leader" / ".replica-snap"
    done = threading.Event()

    def snap() -> None:
        leader.snapshot(str(dest))
        done.set()

    threading.Thread(target=snap, daemon=True).start()
    assert done.wait(2.0), "a snapshot waited for another queue's commit"

    t0 = time.monotonic()
    leader.set_replication(None)  # the node stops leading (on its event loop)
    took = time.monotonic() - t0
    t.join(5.0)
    assert took < 1.0, f"set_replication waited {took:.1f} s for a queue creation's commit"
    assert len(outcome) == 1 and isinstance(outcome[0], ReplicationTimeout)


def test_a_shipped_write_whose_leader_fsync_failed_is_answered_unknown(
    engines: Any, clock: Any
) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    leader.ensure_queue("jobs")
    leader.commit(len(sink.frames))
    hook = FailFsync("jobs")
    fileio.FAULTS.append(hook)
    try:
        fut = leader.enqueue_nowait("jobs", [NewItem(b"in doubt", 0)])
        leader.commit(len(sink.frames))  # the followers have it: it commits there
        with pytest.raises(StorageError) as info:
            fut.result(timeout=5)
    finally:
        fileio.FAULTS.remove(hook)
    assert hook.fired
    assert sink.failures == ["jobs"]
    # the record reached the followers: after a failover it is an item
    follower = engines("follower")
    follower.set_role(False, None)
    follower.apply(sink.frames).result(timeout=5)
    assert [i.value for i in follower.browse("jobs", "all", with_values=True).items] == [
        b"in doubt"
    ]
    assert isinstance(info.value, ReplicationTimeout), (
        f"answered {info.value.code} (refused: it did not happen) for a write the followers hold"
    )


def test_a_failed_queue_reopened_before_the_step_down_reuses_no_shipped_id(
    engines: Any, clock: Any
) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    leader.ensure_queue("jobs")
    leader.commit(len(sink.frames))
    hook = FailFsync("jobs")
    fileio.FAULTS.append(hook)
    try:
        first = leader.enqueue_nowait("jobs", [NewItem(b"refused", 0)])
        with pytest.raises(StorageError):
            first.result(timeout=5)
    finally:
        fileio.FAULTS.remove(hook)
    assert sink.failures == ["jobs"]  # the node is asked to step down; before it does:
    shipped_before = len(sink.frames)
    try:
        second = leader.enqueue_nowait("jobs", [NewItem(b"next", 0)])
        leader.commit(len(sink.frames))
        second.result(timeout=5)
    except StorageError:
        return  # refused before anything was shipped: fine
    # it was taken: the followers now hold both records; ids must differ
    follower = engines("follower")
    follower.set_role(False, None)
    follower.apply(sink.frames).result(timeout=5)
    items = follower.browse("jobs", "all", with_values=True).items
    assert len(sink.frames) > shipped_before
    assert sorted(i.value for i in items) == [b"next", b"refused"], (
        f"the follower holds {[(i.id, i.value) for i in items]}: the reopened queue "
        "reused the id of a record the followers already had"
    )


def _commit_all(engine: Engine, sink: ListSink) -> None:
    engine.commit(len(sink.frames))


def test_a_damaged_queue_on_the_leader_does_not_stop_followers_from_joining(
    tmp_path: Path, clock: Any
) -> None:
    cfg = EngineConfig(fsync="always", compaction="inline", auto_merge=False)
    first = Engine.open(tmp_path / "leader", cfg, clock=clock)
    first.enqueue("good", [NewItem(b"g", 0)])
    first.enqueue("bad", [NewItem(b"b", 0)])
    first.close()
    settings = tmp_path / "leader" / "queues" / "bad" / "queue.json"
    settings.write_bytes(b"{not json")
    leader = Engine.open(tmp_path / "leader", cfg, clock=clock)
    follower = Engine.open(tmp_path / "follower", cfg, clock=clock)
    try:
        assert leader.queue("bad").quarantined
        sink = ListSink()
        leader.set_replication(sink)
        dest = os.path.join(leader.root, ".replica-snap")
        lsns = leader.snapshot(dest)  # every follower's (re)join goes through this
        assert set(lsns) == {"good", "bad"}
        follower.set_role(False, None)
        follower.replace_queues(dest)
        assert [d.value for d in follower.browse("good", with_values=True).items] == [b"g"]
        # the damaged queue travels as it lies on disk: quarantined there too, its
        # files kept for whoever repairs it
        assert follower.queue("bad").quarantined
        copied = tmp_path / "follower" / "queues" / "bad" / "queue.json"
        assert copied.read_bytes() == b"{not json"
    finally:
        leader.close()
        follower.close()


def test_a_queue_deleted_while_a_snapshot_is_taken_is_left_out(
    engines: Any, monkeypatch: Any
) -> None:
    from dq.storage.queue import Queue

    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    for name in ("a-first", "b-gone"):
        leader.ensure_queue(name)
        fut = leader.enqueue_nowait(name, [NewItem(name.encode(), 0)])
        _commit_all(leader, sink)
        fut.result(timeout=5)
    original = Queue.snapshot_into
    deleted: list[str] = []

    def snapshot_into(q: Queue, dest: str) -> int:
        if q.name == "a-first" and not deleted:  # the next queue goes meanwhile
            t = threading.Thread(target=leader.delete_queue, args=("b-gone",), daemon=True)
            t.start()
            _wait_for(lambda: not leader.has_queue("b-gone"))
            _commit_all(leader, sink)
            t.join(5)
            deleted.append("b-gone")
        return original(q, dest)

    monkeypatch.setattr(Queue, "snapshot_into", snapshot_into)
    dest = os.path.join(leader.root, ".replica-snap")
    lsns = leader.snapshot(dest)
    assert deleted == ["b-gone"]
    assert set(lsns) == {"a-first"}
    assert sorted(os.listdir(os.path.join(dest, "queues"))) == ["a-first"]


def test_a_write_waiting_for_the_sync_set_when_its_queue_is_deleted_is_answered_unknown(
    engines: Any,
) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    leader.ensure_queue("jobs")
    _commit_all(leader, sink)
    fut = leader.enqueue_nowait("jobs", [NewItem(b"in doubt", 0)])
    shipped = len(sink.frames)
    t = threading.Thread(target=leader.delete_queue, args=("jobs",), daemon=True)
    t.start()
    try:
        # the deletion closes the queue; its own commit has not come (if it never does,
        # another member takes over with the item and without the deletion)
        with pytest.raises(StorageError) as info:
            fut.result(timeout=5)
        assert len(sink.frames) == shipped + 1  # the deletion, after the item
    finally:
        _commit_all(leader, sink)
        t.join(5)
    assert isinstance(info.value, ReplicationTimeout), (
        f"answered {info.value.code}: {info.value} (refused) for a write the followers hold"
    )


def _stalled_leader_with_a_lease(engines: Any, clock: Any) -> tuple[Engine, ListSink, Any]:
    leader = engines("leader")
    leader.enqueue("jobs", [NewItem(b"held", 0), NewItem(b"waiting", 0)])
    [got] = leader.dequeue("jobs", 1, 1000)
    sink = ListSink()
    leader.set_replication(sink)
    sink.admitting = False  # the sync set has acknowledged nothing for a commit timeout
    return leader, sink, got


def _values(engine: Engine) -> list[bytes]:
    return sorted(i.value for i in engine.browse("jobs", "all", with_values=True).items)


def test_a_lease_expiring_while_the_group_is_stalled_keeps_its_item(
    engines: Any, clock: Any
) -> None:
    leader, sink, _got = _stalled_leader_with_a_lease(engines, clock)
    clock.advance(5000)  # the lease ends: its item is due again
    try:
        leader.expire_leases("jobs")
    except StorageError:
        pass  # refused for now: the item must still be there
    assert _values(leader) == [b"held", b"waiting"], "a refused lease expiry lost its item"
    sink.admitting = True
    # once the group acknowledges again, the item is due again, once
    leader.expire_leases("jobs")
    _wait_for(lambda: (leader.commit(len(sink.frames)), len(_values(leader)) == 2)[1])
    assert sorted(d.value for d in leader.dequeue("jobs", 10)) == [b"held", b"waiting"]


@pytest.mark.parametrize("how", ["delete_item", "purge"])
def test_a_removal_refused_while_the_group_is_stalled_changes_nothing(
    engines: Any, clock: Any, how: str
) -> None:
    leader, sink, got = _stalled_leader_with_a_lease(engines, clock)
    with pytest.raises(StorageError):
        if how == "delete_item":
            leader.delete_item("jobs", got.id)
        else:
            leader.purge("jobs")
    assert _values(leader) == [b"held", b"waiting"], f"a refused {how} removed items"
    sink.admitting = True
    leader.commit(len(sink.frames))
    # the lease is still held: its receipt releases it
    fut = leader.release_nowait("jobs", [Release(got.id, got.receipt)])
    _wait_for(lambda: (leader.commit(len(sink.frames)), fut.done())[1])
    [outcome] = fut.result(timeout=0)
    assert outcome.ok, f"the lease a refused {how} touched is gone: {outcome}"


class StallAfter(ListSink):
    """Commits every frame at once (a follower that always acks) until ``stall_at``
    frames were shipped; from then on the group is stalled (admits no write)."""

    def __init__(self, engine: Engine, stall_at: int) -> None:
        super().__init__()
        self.engine, self.stall_at = engine, stall_at

    def admits_writes(self) -> bool:
        return len(self.frames) < self.stall_at

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        lsn = super().ship(queue, kind, payload)
        threading.Timer(0.01, self.engine.commit, args=(lsn,)).start()
        return lsn


def test_a_redrive_the_group_stalls_half_way_is_not_answered_as_refused(engines: Any) -> None:
    leader = engines("leader")
    leader.enqueue("dead", [NewItem(b"d", 0)])
    sink = StallAfter(leader, stall_at=0)
    leader.set_replication(sink)
    leader.ensure_queue("home")
    shipped = len(sink.frames)
    sink.stall_at = shipped + 1  # the copy into "home" is written, the removal is refused
    try:
        result = leader.redrive("dead", to="home")
    except StorageError as exc:
        assert len(sink.frames) == shipped + 1
        assert isinstance(exc, ReplicationTimeout), (
            f"answered {exc.code} (refused: nothing happened) after the item was copied"
        )
    else:
        raise AssertionError(f"the removal was refused, yet redrive answered {result}")


@pytest.mark.parametrize("change", ["pause", "put_queue", "create", "delete_queue"])
def test_a_queue_change_whose_leader_stops_leading_before_its_commit_is_not_done(
    engines: Any, change: str, monkeypatch: Any
) -> None:
    leader = engines("leader")
    sink = ListSink()
    leader.set_replication(sink)
    t = threading.Thread(target=leader.ensure_queue, args=("jobs",), daemon=True)
    t.start()
    _wait_for(lambda: len(sink.frames) == 1)
    _commit_all(leader, sink)
    t.join(5)
    # the lease is lost between shipping the change and waiting for its commit
    original = type(leader)._await_commit

    def step_down_first(self: Engine, *args: Any) -> None:
        self.set_replication(None)
        original(self, *args)

    monkeypatch.setattr(type(leader), "_await_commit", step_down_first)
    shipped = len(sink.frames)
    with pytest.raises(ReplicationTimeout):  # never "done": the sync set may not have it
        if change == "pause":
            leader.pause("jobs")
        elif change == "put_queue":
            leader.put_queue("jobs", QueueConfig(dedup_window_ms=1000))
        elif change == "create":
            leader.put_queue("fresh", QueueConfig())
        else:
            leader.delete_queue("jobs")
    assert len(sink.frames) == shipped + 1
