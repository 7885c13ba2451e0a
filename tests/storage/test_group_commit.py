"""``GroupCommit``, the queue's log and the batches waiting on it, on its own: the
barrier of unpublished batches, batches ready only once synced (and, on a replica
group's leader, committed) and in the order they were appended, refusals, and cutting
the log back after a failure."""

from __future__ import annotations

from pathlib import Path

import pytest

from dq.storage.config import EngineConfig
from dq.storage.errors import ReplicationStalled, ReplicationTimeout
from dq.storage.group_commit import GroupCommit, PendingBatch
from dq.storage.memseg import MemSegment
from dq.storage.replication import ReplicationSink
from dq.storage.syncer import FsyncStats
from dq.storage.wal import HEADER, RECORD_HEADER, WalWriter


class Sink:
    """A leader's replicator that numbers records and admits writes while told to."""

    commit_timeout_s = 5.0

    def __init__(self) -> None:
        self.shipped: list[tuple[str, int, bytes]] = []
        self.admitting = True

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        self.shipped.append((queue, kind, payload))
        return len(self.shipped)

    def admits_writes(self) -> bool:
        return self.admitting

    def local_failure(self, queue: str, error: BaseException) -> None:
        raise AssertionError("not a group commit's business")


class Host:
    def __init__(self, fsync: str = "always") -> None:
        self.config = EngineConfig(fsync=fsync)  # type: ignore[arg-type]
        self.replication: ReplicationSink | None = None
        self.commit_lsn = 0
        self.fsync_stats = FsyncStats()


def started(tmp_path: Path, host: Host) -> GroupCommit:
    commit = GroupCommit("q", host)
    commit.start(WalWriter.create(str(tmp_path), 1, 1))
    return commit


def batch() -> PendingBatch:
    return PendingBatch(MemSegment(1), "done")


def test_the_barrier_is_the_smallest_key_held() -> None:
    commit = GroupCommit("q", Host())
    assert commit.barrier() is None
    a = commit.hold(b"\x05" * 16)
    b = commit.hold(b"\x02" * 16)
    assert commit.barrier() == b"\x02" * 16
    commit.unhold(b)
    assert commit.barrier() == b"\x05" * 16
    commit.unhold(b)  # lifted already: nothing happens
    commit.unhold(a)
    assert commit.barrier() is None


def test_a_batch_is_ready_once_a_round_synced_its_record_in_append_order(
    tmp_path: Path,
) -> None:
    host = Host()
    commit = started(tmp_path, host)
    first, second = batch(), batch()
    commit.append(first, b"one")
    commit.append(second, b"two")
    assert commit.waiting == [first, second] and (first.seq, second.seq) == (1, 2)
    assert commit.wal.offset == HEADER.size  # appended to memory only
    wal, data, seq = commit.take_round()
    late = batch()
    commit.append(late, b"three")  # after the round took the buffer: the next round's
    assert commit.write_round(wal, data) is None
    assert wal.synced_offset == HEADER.size + 2 * RECORD_HEADER.size + 6
    assert host.fsync_stats.count == 1
    assert commit.synced(wal, seq) == [first, second]
    assert commit.waiting == [late] and not late.synced


def test_on_a_leader_a_batch_is_ready_once_synced_and_committed(tmp_path: Path) -> None:
    host = Host()
    sink = Sink()
    host.replication = sink
    commit = started(tmp_path, host)
    first, second = batch(), batch()
    commit.append(first, b"one")
    commit.append(second, b"two")
    assert [p for _q, _k, p in sink.shipped] == [b"one", b"two"]
    assert (first.lsn, second.lsn, commit.last_lsn) == (1, 2, 2)
    wal, data, seq = commit.take_round()
    assert commit.write_round(wal, data) is None
    assert commit.synced(wal, seq) == []  # synced, not committed
    host.commit_lsn = 1
    assert commit.ready() == [first]
    host.commit_lsn = 2
    assert commit.ready() == [second] and commit.waiting == []


def test_a_batch_waits_behind_an_earlier_one_not_committed_yet(tmp_path: Path) -> None:
    host = Host()
    host.replication = Sink()
    commit = started(tmp_path, host)
    shipped = batch()
    commit.append(shipped, b"one")
    host.replication = None  # the node stopped leading: a record numbered 0
    local = batch()
    commit.append(local, b"two")
    wal, data, seq = commit.take_round()
    commit.write_round(wal, data)
    assert commit.synced(wal, seq) == []  # published in append order, or not at all
    assert commit.refuse_replicated() == [shipped] and commit.last_lsn == 0
    assert commit.ready() == [local]


def test_a_stalled_replica_group_refuses_before_anything_is_appended(tmp_path: Path) -> None:
    host = Host()
    sink = Sink()
    sink.admitting = False
    host.replication = sink
    commit = started(tmp_path, host)
    size = commit.wal.size
    with pytest.raises(ReplicationStalled):
        commit.append(batch(), b"one")
    assert commit.wal.size == size and commit.waiting == [] and sink.shipped == []


def test_overdue_replicated_writes_are_answered_unknown_and_stay_waiting(
    tmp_path: Path,
) -> None:
    host = Host()
    host.replication = Sink()
    commit = started(tmp_path, host)
    b = batch()
    commit.append(b, b"one")
    assert commit.overdue(b.deadline - 0.001) == []
    [(fut, result, error)] = commit.overdue(b.deadline)
    assert fut is b.future and result is None and isinstance(error, ReplicationTimeout)
    assert commit.waiting == [b]
    b.future.set_exception(error)
    assert commit.overdue(b.deadline + 1) == []  # answered once


def test_refuse_all_takes_every_waiting_batch_in_append_order(tmp_path: Path) -> None:
    commit = started(tmp_path, Host())
    batches = [batch() for _ in range(3)]
    for b in batches:
        commit.append(b, b"x")
    assert commit.refuse_all() == batches and commit.waiting == []


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_cutting_back_keeps_exactly_what_was_acknowledged_once_per_failure(
    tmp_path: Path, fsync: str
) -> None:
    """Acknowledged is synced with ``always``, written otherwise; the rest belongs to
    refused batches."""
    commit = started(tmp_path, Host(fsync))
    commit.append(batch(), b"acknowledged")
    if fsync == "always":
        wal, data, _seq = commit.take_round()
        commit.write_round(wal, data)
    else:
        commit.write_now()
    kept = commit.wal.offset
    commit.append(batch(), b"refused")
    if fsync == "always":
        commit.write_now()  # written, but the sync that would acknowledge it failed
    commit.wal.discard_buffer()
    path = Path(commit.wal.path)
    commit.cut_back()
    assert path.stat().st_size == kept and commit.wal.closed
    path.unlink()
    commit.cut_back()  # once per failure: the closed log is not opened again
    commit.start(WalWriter.create(str(tmp_path), 2, 1))
    assert commit.barrier() is None and not commit.wal.closed
