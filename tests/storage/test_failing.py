"""``Failing``, refusing a queue's writes, on its own: a refused batch holds nothing
afterwards (its barrier lifted, its leases given back), and a failed queue refuses
every waiting batch, keeps nothing unacknowledged in its log, and refuses work; on a
replica group's leader a shipped batch is answered "unknown" and the leader steps down
once. (A failure end to end, through a real disk fault, is ``test_faults_sync.py``'s.)"""

from __future__ import annotations

import os
from pathlib import Path

from dq.storage._leases import Lease
from dq.storage.config import EngineConfig
from dq.storage.deliveries import Deliveries
from dq.storage.errors import EngineUnavailable, ReplicationTimeout
from dq.storage.failing import Failing
from dq.storage.group_commit import GroupCommit, PendingBatch
from dq.storage.health import Health
from dq.storage.memseg import MemSegment
from dq.storage.replication import ReplicationSink
from dq.storage.syncer import FsyncStats
from dq.storage.wal import WalWriter


class Sink:
    """A leader's replicator: numbers what it ships, records the step down."""

    commit_timeout_s = 5.0

    def __init__(self) -> None:
        self.failures: list[tuple[str, BaseException]] = []

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        return 1

    def admits_writes(self) -> bool:
        return True

    def local_failure(self, queue: str, error: BaseException) -> None:
        self.failures.append((queue, error))


class Host:
    def __init__(self) -> None:
        self.config = EngineConfig(fsync="always")
        self.replication: ReplicationSink | None = None
        self.commit_lsn = 0
        self.fsync_stats = FsyncStats()

    def now(self) -> int:
        return 1_000


def lease(key: bytes) -> Lease:
    return Lease(key, 1, 0, 1, expires=10_000, delivery=1, source=None)


def parts(tmp_path: Path, host: Host) -> tuple[GroupCommit, Deliveries, Health, Failing]:
    commit = GroupCommit("q", host)
    commit.start(WalWriter.create(str(tmp_path), 1, 1))
    deliveries, health = Deliveries(), Health("q", str(tmp_path))
    health.loaded = True
    return commit, deliveries, health, Failing("q", host, commit, deliveries, health)


def test_a_refused_batch_holds_nothing(tmp_path: Path) -> None:
    commit, deliveries, _health, failing = parts(tmp_path, Host())
    taken = (7, lease(b"k" * 16))
    batch = PendingBatch(MemSegment(1), None, token=commit.hold(b"a" * 16), restore=[taken])
    assert commit.barrier() == b"a" * 16 and 7 not in deliveries.leases
    failing.roll_back(batch)
    assert commit.barrier() is None  # dequeue may pass again
    back = deliveries.leases.get(7)  # the same delivery: its receipt still works
    assert back is not None and (back.key, back.delivery) == (taken[1].key, 1)


def test_a_refused_removal_holds_its_held_items_again(tmp_path: Path) -> None:
    """A batch that removes items held back by their group's limit is refused: they are
    held again, where they were."""
    _commit, deliveries, _health, failing = parts(tmp_path, Host())
    index, key = deliveries.index, b"h" * 16
    index.hold("g", key, 1_000)
    removed = index.remove([(key, "g")], 1_000)
    assert removed and not index.holds(key, "g")
    failing.roll_back(PendingBatch(MemSegment(1), None, unheld=removed))
    assert index.holds(key, "g")


def test_a_failed_queue_refuses_every_waiting_batch_and_keeps_nothing_unsynced(
    tmp_path: Path,
) -> None:
    commit, deliveries, health, failing = parts(tmp_path, Host())
    synced = PendingBatch(MemSegment(1), None)
    commit.append(synced, b"x" * 40)
    wal, data, seq = commit.take_round()
    assert commit.write_round(wal, data) is None
    commit.synced(wal, seq)  # durable: the log keeps it
    kept = os.path.getsize(wal.path)
    first = PendingBatch(MemSegment(1), None, token=commit.hold(b"b" * 16))
    second = PendingBatch(MemSegment(1), None, restore=[(3, lease(b"c" * 16))])
    commit.append(first, b"y" * 40)
    commit.append(second, b"z" * 40)
    wal, data, seq = commit.take_round()
    wal.write(data)  # written, never synced: the failure came with the fsync
    wal.io_lock.release()
    answers = failing.fail(OSError(5, "Input/output error"), "syncing the log")
    assert [a[0] for a in answers] == [second.future, first.future]
    assert all(isinstance(a[2], EngineUnavailable) and a[1] is None for a in answers)
    assert commit.waiting == [] and commit.barrier() is None and 3 in deliveries.leases
    assert isinstance(health.failed, EngineUnavailable) and health.io_errors == 1
    assert os.path.getsize(wal.path) == kept  # cut back to what was acknowledged
    assert failing.fail(OSError(5, "again"), "writing the log") == []  # nothing waits now
    assert health.io_errors == 1


def test_a_leader_answers_a_shipped_batch_unknown_and_steps_down_once(tmp_path: Path) -> None:
    host = Host()
    sink = Sink()
    host.replication = sink
    commit, _deliveries, health, failing = parts(tmp_path, host)
    shipped = PendingBatch(MemSegment(1), None)
    commit.append(shipped, b"x" * 40)
    assert shipped.lsn == 1
    [(fut, _result, error)] = failing.fail(OSError(28, "No space left"), "syncing the log")
    assert fut is shipped.future and isinstance(error, ReplicationTimeout)
    assert [q for q, _e in sink.failures] == ["q"]
    failing.fail(OSError(28, "No space left"), "syncing the log")
    assert len(sink.failures) == 1  # already failed: the leader stepped down once
    assert health.failed is not None


def test_a_queue_that_never_loaded_fails_without_touching_a_log(tmp_path: Path) -> None:
    host = Host()
    commit = GroupCommit("q", host)  # no log: opening failed before one was started
    deliveries, health = Deliveries(), Health("q", str(tmp_path))
    failing = Failing("q", host, commit, deliveries, health)
    assert failing.fail(OSError(24, "Too many open files"), "opening the queue") == []
    assert health.failed is not None and health.recovery_due()
