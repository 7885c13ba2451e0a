"""Engine behaviour a user relies on: bad input, the directory lock, group commit,
dead letters, waiting for due items, interval durability and events."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig, Extend, NewItem, QueueConfig, Release, Requeue
from dq.storage import engine as engine_module
from dq.storage._leases import RECORD
from dq.storage.errors import (
    BatchTooLarge,
    ConfigConflict,
    DataDirLocked,
    InvalidArgument,
    InvalidDeadline,
    InvalidQueueName,
    OutOfRange,
    QueueNotFound,
    StorageError,
    ValueTooLarge,
)
from tests.storage.conftest import FakeClock

ROOT = Path(__file__).resolve().parents[2]


def state(e: Engine, q: str) -> tuple[int, int, int]:
    queue = e.queue(q)
    return queue.next_id, queue.commit.wal.size, queue.stats().pending


@pytest.mark.parametrize(
    "items,error",
    [
        ([NewItem(b"x" * 1025)], ValueTooLarge),
        ([NewItem(b"ok"), NewItem(b"x" * 2000)], ValueTooLarge),  # one bad item spoils the batch
        ([NewItem(b"x", deadline=1 << 48)], OutOfRange),
        ([NewItem(b"x", deadline=-1)], OutOfRange),
        ([NewItem(b"x", delay_ms=(1 << 48) - 1)], InvalidDeadline),  # past the last deadline
        ([NewItem(b"x", delay_ms=-5)], InvalidArgument),
        ([NewItem(b"x", deadline=5, delay_ms=5)], InvalidArgument),
        ([NewItem(b"x")] * 11, BatchTooLarge),
    ],
)
def test_bad_enqueue_is_refused_and_writes_nothing(
    open_engine: Callable[..., Engine], items: list[NewItem], error: type[StorageError]
) -> None:
    e = open_engine(max_value_bytes=1024, max_batch=10)
    e.enqueue("q", [NewItem(b"first")])
    before = state(e, "q")
    with pytest.raises(error) as exc:
        e.enqueue("q", items)
    assert isinstance(exc.value, StorageError) and exc.value.code
    assert state(e, "q") == before


@pytest.mark.parametrize("name", ["", "a/b", "..", "x" * 129, "sp ace", "é"])
def test_invalid_queue_names(open_engine: Callable[..., Engine], name: str) -> None:
    e = open_engine()
    with pytest.raises(InvalidQueueName):
        e.enqueue(name, [NewItem(b"x")])
    assert e.list_queues() == []
    assert os.listdir(Path(e.root) / "queues") == []


def test_unknown_queue_and_ids(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    with pytest.raises(QueueNotFound):
        e.dequeue("nope")
    [item] = e.enqueue("q", [NewItem(b"x")])
    [d] = e.dequeue("q")
    out = e.release(
        "q",
        [
            Release(99, f"{d.receipt.split('.')[0]}.63.1"),  # never assigned
            Release(d.id, "garbage"),
            Release(d.id, d.receipt.replace(f".{d.id:x}.", ".2.")),  # receipt of another id
        ],
    )
    assert [o.error for o in out] == ["item_not_found", "invalid_receipt", "invalid_receipt"]
    assert e.stats("q").leased == 1  # nothing changed
    assert e.release("q", [Release(item.id, d.receipt)])[0].ok


def test_stale_receipts_after_expiry_and_restart(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"x")])
    [d1] = e.dequeue("q", lease_ms=1000)
    clock.advance(1001)
    [d2] = e.dequeue("q", lease_ms=1000)  # the lease ran out: redelivered
    assert d2.id == d1.id and d2.stats.dequeue_count == 2 and d2.receipt != d1.receipt
    for op in (
        lambda: e.release("q", [Release(d1.id, d1.receipt)]),
        lambda: e.requeue("q", [Requeue(d1.id, d1.receipt)]),
        lambda: e.extend("q", [Extend(d1.id, d1.receipt, 5000)]),
    ):
        assert op()[0].error == "stale_receipt"
    path = e.root
    e.close()
    e = open_engine(path=path)
    assert e.release("q", [Release(d2.id, d2.receipt)])[0].error == "stale_receipt"
    [d3] = e.dequeue("q")
    assert d3.id == d1.id and d3.stats.dequeue_count == 2  # the expiry's requeue was durable


@pytest.mark.integration
def test_second_process_cannot_open_the_directory(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never")):
        code = (
            "import sys\nfrom dq.storage import Engine\nfrom dq.storage.errors import DataDirLocked\n"
            "try:\n    Engine.open(sys.argv[1])\nexcept DataDirLocked:\n    sys.exit(3)\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, str(tmp_path / "d")], cwd=ROOT, timeout=60
        )
        assert out.returncode == 3
        with pytest.raises(DataDirLocked):
            Engine.open(tmp_path / "d")
    Engine.open(tmp_path / "d").close()  # free again once closed


def test_concurrent_writers_share_fsyncs(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always")) as e:
        e.enqueue("q", [NewItem(b"warm")])
        before = e.fsync_stats.count
        barrier = threading.Barrier(16)

        def write() -> None:
            barrier.wait(timeout=30)
            for _ in range(20):
                e.enqueue("q", [NewItem(b"v")])

        threads = [threading.Thread(target=write) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        syncs = e.fsync_stats.count - before
        assert e.stats("q").pending == 1 + 16 * 20
        assert 0 < syncs < 16 * 20, f"{syncs} fsyncs for {16 * 20} acknowledged writes"


def test_dead_letter_after_max_deliveries(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(
        "work", QueueConfig(default_lease_ms=100, max_deliveries=2, dead_letter_queue="graveyard")
    )
    [item] = e.enqueue("work", [NewItem(b"poison")])
    for attempt in (1, 2):
        [d] = e.dequeue("work")
        assert d.stats.dequeue_count == attempt
        clock.advance(101)
    assert e.dequeue("work") == []  # a third delivery would exceed max_deliveries
    [dead] = e.dequeue("graveyard")
    assert dead.value == b"poison" and dead.stats.dequeue_count == 3  # 2 in "work" + this one
    assert dead.stats.enqueue_time == clock.now - 202
    assert e.stats("work").pending == 0
    assert item.id >= 1


def test_dead_letter_config_is_validated(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    with pytest.raises(ConfigConflict):
        e.put_queue("a", QueueConfig(dead_letter_queue="a"))
    with pytest.raises(InvalidArgument):
        e.put_queue("a", QueueConfig(max_deliveries=0))
    with pytest.raises(InvalidArgument):
        e.put_queue("a", QueueConfig(default_lease_ms=0))
    assert e.list_queues() == []


def test_config_survives_restart(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    cfg = QueueConfig(default_lease_ms=1234, max_deliveries=5, dead_letter_queue="dlq")
    e.put_queue("a", cfg)
    path = e.root
    e.close()
    assert open_engine(path=path).get_queue("a") == cfg


def test_next_wakeup_and_watch(open_engine: Callable[..., Engine], clock: FakeClock) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig())
    assert e.next_wakeup("q") is None
    woke: list[int] = []
    unsubscribe = e.watch("q", lambda: woke.append(1))
    e.enqueue("q", [NewItem(b"later", delay_ms=5000)])
    assert woke and e.next_wakeup("q") == clock.now + 5000
    assert e.dequeue("q") == []
    clock.advance(5000)
    [d] = e.dequeue("q", lease_ms=700)
    assert e.next_wakeup("q") == clock.now + 700  # the lease expiry is the next event
    unsubscribe()
    e.enqueue("q", [NewItem(b"x")])
    assert len(woke) == 1
    assert d.value == b"later"


def test_past_deadlines_are_kept_but_never_behind_the_cursor(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    e = open_engine()
    now = clock.now
    e.enqueue("q", [NewItem(b"a", deadline=now - 10_000), NewItem(b"b", deadline=now - 5_000)])
    [first] = e.dequeue("q")
    assert (first.value, first.deadline) == (b"a", now - 10_000)  # kept, ordered by deadline
    [late] = e.enqueue("q", [NewItem(b"c", deadline=now - 20_000)])
    assert late.deadline == now - 10_000  # advanced to the cursor's deadline
    assert [d.value for d in e.dequeue("q", 10)] == [b"c", b"b"]


def test_an_older_id_requeued_to_a_past_deadline_goes_just_past_the_cursor(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """At the cursor's deadline an older id would sort before the cursor, where dequeue
    never looks (lost until a restart): it goes one millisecond later, a newer id at
    the cursor's deadline itself (``docs/storage.md``, "Deadlines in the past")."""
    e = open_engine()
    now = clock.now
    _a, b, _c, _d = e.enqueue(
        "q",
        [
            NewItem(b"a", deadline=now - 100),
            NewItem(b"b", deadline=now - 50),
            NewItem(b"c", deadline=now - 200),
            NewItem(b"d", deadline=now - 50),
        ],
    )
    got = {x.value: x for x in e.dequeue("q", 3)}  # c, a, b: the cursor is at b's key
    assert sorted(got) == [b"a", b"b", b"c"]
    older, newer = got[b"a"], got[b"c"]  # ids below and above the cursor's (b's)
    assert older.id < b.id < newer.id
    moved = e.requeue(
        "q",
        [
            Requeue(older.id, older.receipt, deadline=now - 10_000),
            Requeue(newer.id, newer.receipt, deadline=now - 10_000),
        ],
    )
    assert [(o.error, o.deadline) for o in moved] == [(None, now - 49), (None, now - 50)]
    assert [(x.value, x.deadline) for x in e.dequeue("q", 10)] == [
        (b"c", now - 50),
        (b"d", now - 50),
        (b"a", now - 49),
    ]
    assert e.stats("q").pending == 4 and e.stats("q").leased == 4


def test_interval_mode_syncs_in_the_background(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="interval", fsync_interval_ms=10)) as e:
        e.enqueue("q", [NewItem(b"x")])
        for _ in range(500):
            if e.fsync_stats.count:
                break
            threading.Event().wait(0.01)
        assert e.fsync_stats.count >= 1


def test_events(open_engine: Callable[..., Engine]) -> None:
    e = open_engine()
    seen = []
    e.on_event(lambda ev: seen.append((ev.kind, ev.queue, ev.ids)))
    [a] = e.enqueue("q", [NewItem(b"x")])
    [d] = e.dequeue("q")
    e.release("q", [Release(d.id, d.receipt)])
    e.delete_queue("q")
    assert seen == [
        ("queue_created", "q", ()),
        ("enqueued", "q", (a.id,)),
        ("released", "q", (a.id,)),
        ("queue_deleted", "q", ()),
    ]
    assert e.list_queues() == []
    assert not (Path(e.root) / "queues" / "q").exists()


def test_counters_and_unwanted_events(
    open_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listener whose ``wanted`` says no is skipped, and while nobody wants an event
    none is built."""
    e = open_engine()
    seen: list[tuple[str, tuple[int, ...]]] = []
    asked: list[bool] = []
    reading = False

    def wanted() -> bool:
        asked.append(reading)
        return reading

    e.on_event(lambda ev: seen.append((ev.kind, ev.ids)), wanted=wanted)
    built: list[object] = []
    real_event = engine_module.Event

    def counting_event(*args: Any) -> Any:
        built.append(args)
        return real_event(*args)

    monkeypatch.setattr(engine_module, "Event", counting_event)
    first = e.enqueue("q", [NewItem(b"a"), NewItem(b"b")])
    assert built == [] and seen == [] and len(asked) == 2  # queue_created, enqueued
    reading = True
    later = e.enqueue("q", [NewItem(b"c"), NewItem(b"d"), NewItem(b"e")])
    assert seen == [("enqueued", tuple(x.id for x in later))] and len(built) == 1
    assert [x.id for x in later] == [first[-1].id + 1, first[-1].id + 2, first[-1].id + 3]


def test_totals_count_items_enqueued_released_and_expired(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """``Engine.totals``: items enqueued, released, and whose lease ran out, since start."""
    e = open_engine()
    e.enqueue("q", [NewItem(b"a"), NewItem(b"b"), NewItem(b"c")])
    assert e.totals("q") == (3, 0, 0)
    first, _second = e.dequeue("q", 2, lease_ms=1000)
    e.release("q", [Release(first.id, first.receipt)])
    assert e.totals("q") == (3, 1, 0)
    clock.advance(2000)
    e.expire_leases("q")
    assert e.totals("q") == (3, 1, 1)


def test_ids_are_never_reused_after_everything_is_merged_away(
    open_engine: Callable[..., Engine],
) -> None:
    e = open_engine()
    ids = [x.id for x in e.enqueue("q", [NewItem(b"x") for _ in range(5)])]
    got = e.dequeue("q", 5)
    e.release("q", [Release(d.id, d.receipt) for d in got])
    e.freeze("q")
    q = e.queue("q")
    if q.segments:
        q.merge(0, len(q.segments))
    assert e.queue("q").segments == []
    path = e.root
    e.close()
    e = open_engine(path=path)
    [new] = e.enqueue("q", [NewItem(b"y")])
    assert new.id > max(ids)
    with pytest.raises(DataDirLocked):
        Engine.open(path)


@pytest.mark.integration
def test_logs_grow_in_preallocated_steps_and_recover(tmp_path: Path) -> None:
    """By default a log is allocated 64 KiB ahead of its records, through the seam's
    ``allocate`` step: no byte is written for it (each round is one write, of its
    records), the zeros read as the end of the log, and closing gives them back."""
    from dq.storage import fileio

    cfg = EngineConfig(fsync="always", auto_merge=False)
    assert cfg.wal_prealloc_bytes == 64 * 1024
    steps: list[tuple[str, str]] = []
    with Engine.open(tmp_path / "d", cfg) as e:
        e.ensure_queue("q")

        def hook(step: str, path: str) -> None:
            steps.append((step, path))

        fileio.FAULTS.append(hook)
        try:
            for _ in range(10):
                e.enqueue("q", [NewItem(b"v" * 100)])
            wal = e.queue("q").commit.wal
            on_disk = os.path.getsize(wal.path)
            assert on_disk == 64 * 1024 and wal.offset < on_disk  # zeros ahead of the data
            e.enqueue("q", [NewItem(b"w" * 1000) for _ in range(100)])
            assert wal.offset > 64 * 1024 and os.path.getsize(wal.path) == 2 * 64 * 1024
        finally:
            fileio.FAULTS.remove(hook)
        logged = [step for step, path in steps if path == wal.path]
        assert logged.count("allocate") == 2
        assert logged.count("write") == logged.count("fsync") == 11  # one per round
        blocks = os.stat(wal.path).st_blocks * 512
        assert blocks >= 2 * 64 * 1024  # allocated, though never written
    assert os.path.getsize(wal.path) == wal.offset  # closing gave the rest back
    with Engine.open(tmp_path / "d", cfg) as e:  # the zeros read as the end of the log
        assert e.stats("q").pending == 110


def test_a_file_system_that_cannot_allocate_ahead_gets_plain_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``posix_fallocate`` is not supported the log appends as it did before it
    was allocated ahead: every write acknowledged, the file exactly its records, and
    the allocation not asked for again."""
    import errno

    calls: list[int] = []

    def unsupported(fd: int, offset: int, length: int) -> None:
        calls.append(length)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    cfg = EngineConfig(fsync="always", auto_merge=False, compaction="inline")
    with Engine.open(tmp_path / "d", cfg) as e:
        for i in range(20):  # 80 KB: past the first 64 KiB step
            e.enqueue("q", [NewItem(b"%d" % i + b"v" * 4000)])
        wal = e.queue("q").commit.wal
        assert wal.offset > 64 * 1024 and os.path.getsize(wal.path) == wal.offset
    assert len(calls) == 1
    with Engine.open(tmp_path / "d", cfg) as e:
        assert e.stats("q").pending == 20


def test_a_failed_log_write_is_refused_and_leaves_no_trace(
    open_engine: Callable[..., Engine],
) -> None:
    import errno

    from dq.storage import fileio
    from dq.storage.errors import StorageFull

    e = open_engine()
    e.enqueue("q", [NewItem(b"before")])

    def disk_full(step: str, path: str) -> None:
        if step == "write" and path.endswith(".log"):
            raise StorageFull("no space left on device", file=path, errno=errno.ENOSPC)

    fileio.FAULTS.append(disk_full)
    try:
        with pytest.raises(StorageFull):
            e.enqueue("q", [NewItem(b"lost")])
    finally:
        fileio.FAULTS.clear()
    e.enqueue("q", [NewItem(b"after")])
    assert [d.value for d in e.dequeue("q", 10)] == [b"before", b"after"]
    path = e.root
    e.close()
    e = open_engine(path=path)
    assert sorted(d.value for d in e.dequeue("q", 10)) == [b"after", b"before"]


def test_released_leases_do_not_pile_up_in_the_expiry_heap(
    open_engine: Callable[..., Engine],
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"x") for _ in range(1000)])
    for _ in range(5):
        e.enqueue("q", [NewItem(b"x") for _ in range(1000)])
        got = e.dequeue("q", 1000, lease_ms=600_000)  # long leases: nothing expires
        e.release("q", [Release(d.id, d.receipt) for d in got])
    leases = e.queue("q").deliveries.leases
    assert len(leases) == 0
    assert leases.allocated < 64 * (RECORD + 16)  # ended leases leave nothing behind


def test_a_cancelled_waiter_does_not_strand_its_sync_batch(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always")) as e:
        e.enqueue("q", [NewItem(b"warm")])
        q = e.queue("q")
        with q.lock:  # hold the syncer off so both writes ride the same fsync
            first = e.enqueue_nowait("q", [NewItem(b"a")])
            second = e.enqueue_nowait("q", [NewItem(b"b")])
            assert first.cancel()  # e.g. an HTTP client went away
        assert [x.id for x in second.result(timeout=10)] == [3]
        assert e.stats("q").pending == 3  # the cancelled write was still made durable
