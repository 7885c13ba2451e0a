"""``FileJobs``, a queue's rotations, freezes and merges, on their own (real parts, the
compaction worker inline, a fault at one file step): when a log rotates and writes
stall, a rotation that cannot start or cannot close its log, the sync round's share of
a rotation with ``always``, a freeze retried until it succeeds, a merge installed or
backing off, an idle log frozen for its tombstones. The queue itself is only handed to
the syncer and the merge policy: here a stand-in that may not be called. (The same
jobs through the engine, under every fault, are ``test_fault_matrix.py``'s.)"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dq.storage.codec import PENDING_HEADER, encode_key, encode_stats
from dq.storage.compactor import Compactor
from dq.storage.config import EngineConfig
from dq.storage.deliveries import Deliveries
from dq.storage.failing import Failing
from dq.storage.file_jobs import FileJobs
from dq.storage.group_commit import GroupCommit, PendingBatch
from dq.storage.health import Health
from dq.storage.itemmeta import ItemMeta
from dq.storage.replication import ReplicationSink
from dq.storage.segment_set import SegmentSet
from dq.storage.syncer import FsyncStats, SyncTarget
from dq.storage.timers import Timers
from dq.storage.wal import WalWriter, read_wal
from tests.storage.faults import OneShot

ST = encode_stats(1, 0, 0)


class Marks:
    """A syncer that records what it was handed."""

    def __init__(self) -> None:
        self.dirty: list[SyncTarget] = []

    def mark_dirty(self, target: SyncTarget) -> None:
        self.dirty.append(target)


class Host:
    def __init__(self, fsync: str = "never", memseg_bytes: int = 1 << 20) -> None:
        self.config = EngineConfig(fsync=fsync, memseg_bytes=memseg_bytes)  # type: ignore[arg-type]
        self.syncer = Marks() if fsync != "never" else None
        self.compactor = Compactor("inline")
        self.replication: ReplicationSink | None = None
        self.commit_lsn = 0
        self.fsync_stats = FsyncStats()
        self.hooked: list[object] = []
        #: the queue the jobs are of, kept here: the jobs hold it weakly (as the engine
        #: holds its queues, the host holds this one)
        self.owner = Owner()

    def merge_policy_hook(self, source: object) -> None:
        self.hooked.append(source)

    def now(self) -> int:
        return 1_000


class Owner:
    """The queue as the syncer and the merge policy know it: handed over, never called."""

    name = "q"

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the file jobs called the queue's {name}")


def jobs_of(tmp_path: Path, host: Host) -> FileJobs:
    lock = threading.RLock()
    commit = GroupCommit("q", host)
    commit.start(WalWriter.create(str(tmp_path), 1, 1))
    files, deliveries = SegmentSet("q", str(tmp_path)), Deliveries()
    health = Health("q", str(tmp_path))
    health.loaded = True
    return FileJobs(
        "q",
        str(tmp_path),
        lock,
        host,  # type: ignore[arg-type]
        host.owner,  # type: ignore[arg-type]
        commit=commit,
        files=files,
        deliveries=deliveries,
        health=health,
        failing=Failing("q", host, commit, deliveries, health),
        timers=Timers(lock),
        meta=ItemMeta(),
    )


def write(jobs: FileJobs, ids: range) -> None:
    """As the queue's write path: a record into the log, its entries into memory."""
    for item_id in ids:
        key, value = encode_key(1000 + item_id, item_id), b"v%d" % item_id
        jobs.commit.append(
            PendingBatch(jobs.files.memseg, None), PENDING_HEADER.pack(key, ST, len(value)) + value
        )
        if jobs.host.config.fsync != "always":
            jobs.commit.write_now()
        jobs.files.memseg.add(key, ST, value)
    jobs.commit.next_id = ids.stop


def wait_for(cond: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def test_a_full_log_rotates_and_its_segment_file_joins_the_set(tmp_path: Path) -> None:
    host = Host(memseg_bytes=400)
    jobs = jobs_of(tmp_path, host)
    write(jobs, range(1, 4))
    assert 0 < jobs.fill() <= 800 and not jobs.stalled()
    write(jobs, range(4, 40))
    assert jobs.stalled()  # twice over its limit: writes wait
    with jobs.lock:
        assert jobs.request_rotation() == []
    assert jobs.commit.wal.segment_no == 2 and jobs.files.memseg.segment_no == 2
    assert read_wal(jobs.commit.wal.path).id_floor == 40  # its header keeps the id counter
    [reader] = jobs.files.segments
    assert (reader.seg_lo, reader.info.pending_count) == (1, 39)
    assert not os.path.exists(tmp_path / "0000000001.log_ro") and jobs.files.frozen == []
    assert host.hooked == [jobs.owner] and not jobs.stalled()


def test_a_next_log_that_cannot_be_made_leaves_the_queue_on_its_log(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host())
    write(jobs, range(1, 3))
    with OneShot("rotation", "create", "log.tmp", errno.ENOSPC).armed() as fault, jobs.lock:
        assert jobs.request_rotation() == []
        assert fault.fired is not None
        assert jobs.request_rotation() == []  # backing off: not tried again yet
    assert jobs.commit.wal.segment_no == 1 and jobs.files.rotation_failures == 1
    assert jobs.files.rotate_requested and jobs.health.failed is None  # still writable
    time.sleep(0.06)
    with jobs.lock:
        jobs.retry_rotation()
    assert jobs.commit.wal.segment_no == 2 and not jobs.files.rotate_requested


def test_a_log_that_cannot_be_closed_fails_the_queue(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host(fsync="interval"))
    write(jobs, range(1, 3))
    with OneShot("rotation", "fsync", "log", errno.EIO).armed() as fault, jobs.lock:
        refused, rotation = jobs.begin_rotation()
    assert fault.fired is not None and rotation is None and refused == []
    assert jobs.health.failed is not None and jobs.commit.wal.segment_no == 1
    assert not os.path.exists(tmp_path / "0000000002.log")  # the next log is gone again


def test_with_always_the_sync_round_carries_the_rotation_out(tmp_path: Path) -> None:
    host = Host(fsync="always")
    jobs = jobs_of(tmp_path, host)
    write(jobs, range(1, 3))
    with jobs.lock:
        assert jobs.request_rotation() == []  # asked for: the next sync round does it
        assert jobs.commit.wal.segment_no == 1 and jobs.files.rotate_requested
        jobs.retry_rotation()  # a stalled write hands the queue to the syncer
        assert isinstance(host.syncer, Marks) and host.syncer.dirty == [jobs.owner]
        refused, rotation = jobs.begin_rotation()
        assert refused == [] and rotation is not None
        assert rotation.old.segment_no == 1 and rotation.old.appended_seq == 2
        # (the sync round publishes what the closed log made durable here)
        assert jobs.commit.wal.segment_no == 1  # still, until the second step
        jobs.end_rotation(rotation)
    assert jobs.commit.wal is rotation.new and [r.seg_lo for r in jobs.files.segments] == [1]


def test_a_failed_freeze_is_tried_again_until_it_succeeds(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host())
    write(jobs, range(1, 5))
    with OneShot("freeze", "create", "seg.tmp", errno.ENOSPC).armed() as fault, jobs.lock:
        jobs.request_rotation()
        assert fault.fired is not None
        assert jobs.files.freeze_failures == 1 and len(jobs.files.frozen) == 1
    wait_for(lambda: not jobs.files.frozen)  # the timer's retry installs it
    [reader] = jobs.files.segments
    assert reader.info.pending_count == 4


def test_a_freeze_of_an_earlier_load_installs_nothing(tmp_path: Path) -> None:
    host = Host()
    host.compactor = Compactor("thread")
    jobs = jobs_of(tmp_path, host)
    write(jobs, range(1, 5))
    gate = threading.Event()
    real = host.compactor.submit

    def held(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
        def after_the_gate() -> object:  # the freeze finishes after the reload
            assert gate.wait(10)
            return fn(*args, **kwargs)

        return real(after_the_gate)

    host.compactor.submit = held  # type: ignore[method-assign]
    with jobs.lock:
        jobs.request_rotation()
        jobs.files.generation += 1  # the queue reloaded from disk meanwhile
    gate.set()
    host.compactor.wait_idle(timeout=10)
    host.compactor.shutdown()  # its callbacks are done too
    assert jobs.files.segments == [] and len(jobs.files.frozen) == 1


def test_a_merge_output_replaces_its_inputs(tmp_path: Path) -> None:
    host = Host()
    jobs = jobs_of(tmp_path, host)
    for first in (1, 10):
        write(jobs, range(first, first + 5))
        with jobs.lock:
            jobs.request_rotation()
    assert [r.seg_lo for r in jobs.files.segments] == [1, 2] and jobs.merge_idle()
    with jobs.lock:
        taken = jobs.files.start_merge(0, 2)
    assert taken is not None and not jobs.merge_idle()  # one merge at a time
    jobs.merge(*taken, wait=True)
    [merged] = jobs.files.segments
    assert (merged.seg_lo, merged.seg_hi, merged.info.pending_count) == (1, 2, 10)
    assert jobs.merge_idle() and host.hooked[-1] is jobs.owner
    for refusing in ("failed", "closed", "not loaded"):
        health = Health("q", str(tmp_path))
        health.loaded = refusing != "not loaded"
        health.closed = refusing == "closed"
        if refusing == "failed":
            health.fail(OSError(5, "EIO"), "syncing the log")
        jobs.health = health
        assert not jobs.merge_idle(), refusing


def test_a_failed_merge_makes_the_policy_wait(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host())
    for first in (1, 10):
        write(jobs, range(first, first + 5))
        with jobs.lock:
            jobs.request_rotation()
    with jobs.lock:
        taken = jobs.files.start_merge(0, 2)
    assert taken is not None
    with OneShot("merge", "create", "seg.tmp", errno.ENOSPC).armed() as fault:
        jobs.merge(*taken, wait=False)
    assert fault.fired is not None and jobs.files.merge_error is not None
    assert len(jobs.files.segments) == 2 and not jobs.merge_idle()  # backing off


def test_an_idle_log_holding_tombstones_is_frozen(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host())
    write(jobs, range(1, 3))
    jobs.freeze_if_idle(0.0)
    assert jobs.commit.wal.segment_no == 1  # no tombstone: nothing for a merge to use
    jobs.files.memseg.add_tombstones_behind(1)
    jobs.freeze_if_idle(60.0)
    assert jobs.commit.wal.segment_no == 1  # written to a moment ago
    jobs.freeze_if_idle(0.0)
    assert jobs.commit.wal.segment_no == 2 and len(jobs.files.segments) == 1


def test_closing_stops_a_running_merge(tmp_path: Path) -> None:
    jobs = jobs_of(tmp_path, Host())
    with jobs.lock:
        jobs.stop_merge()
        assert not os.path.exists(jobs.cancel_marker)  # no merge: nothing to stop
        jobs.files.merging = True
        jobs.stop_merge()
    assert os.path.exists(jobs.cancel_marker)
