"""Writer-led group commit of ring writes (``storage/syncer.py``, ``Syncer.lead``): with
``fsync always`` a ring session's thread makes its own writes durable — a lone writer
hands nothing to the syncer thread — and the writes of sessions that arrive while one
leads join its rounds. Seen from where each log write and fsync runs (a fault hook that
notes the thread), through real clients of a live ``ShmServer``.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.shm import command_codec as codec
from dq.shm.attach import attach
from dq.shm.command_ring import ClientRing, Op, Status
from dq.shm.server import ShmServer
from dq.storage import Engine, fileio
from dq.storage.syncer import LEAD_PASSES, Syncer
from tests.shm.conftest import WAIT_S, serving
from tests.storage.faults import OneShot, file_kind


class Where:
    """A fault hook that raises nothing: the threads that wrote and synced a log."""

    def __init__(self) -> None:
        self.threads: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, step: str, path: str) -> None:
        if step in ("write", "fsync") and file_kind(path) == "log":
            with self._lock:
                self.threads.append((step, threading.current_thread().name))


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, ShmServer]]:
    data = tmp_path / "data"
    with serving(data, "always", ("jobs",), auto_merge=False, compaction="inline") as pair:
        yield pair


def put(ring: ClientRing, value: bytes) -> tuple[int, bytes]:
    got = ring.call(Op.PUT, codec.encode_put(None, None), value, timeout_s=WAIT_S)
    return got.status, got.body


def test_a_lone_ring_writer_syncs_on_its_own_thread(served: tuple[Engine, ShmServer]) -> None:
    engine, server = served
    attachment = attach(server.data_dir, queue="jobs", capacity=8)
    ring = ClientRing(attachment.mm, spin_us=0.0)
    where = Where()
    fileio.FAULTS.append(where)
    try:
        by_syncer, _, _ = engine.syncer.counts()  # type: ignore[union-attr]
        for i in range(20):
            assert put(ring, f"v{i}".encode())[0] == Status.OK
        # a FIND after the writes waits for nothing but their own commit
        found = ring.call(Op.FIND, codec.encode_find(20, 0, None), b"", timeout_s=WAIT_S)
        assert len(codec.decode_deliveries(found.body)) == 20
    finally:
        fileio.FAULTS.remove(where)
        ring.close()
        attachment.close()
    assert engine.syncer.counts()[0] == by_syncer  # type: ignore[union-attr]
    assert where.threads, "no log write was seen"
    assert {name for _, name in where.threads} == {"dq-shm-1"}
    assert sum(step == "fsync" for step, _ in where.threads) >= 1


class Steps:
    """A fault hook that raises nothing: every file step, its file's kind and its thread,
    and the log's size as each fsync of it starts (its write done)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        self.synced_sizes: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, step: str, path: str) -> None:
        with self._lock:
            kind = file_kind(path)
            self.seen.append((step, kind, threading.current_thread().name))
            if step == "fsync" and kind == "log":
                self.synced_sizes.append(os.stat(path).st_size)


def test_a_lone_durable_single_op_costs_one_write_and_one_fsync(
    served: tuple[Engine, ShmServer],
) -> None:
    """The floor of a durable single operation, counted through the fault seam instead of
    timed: a lone client's PUT is one log write and one fsync on its session's thread —
    no second fsync, no directory sync, no other file touched, no hand-off to the syncer
    thread — and a FIND + DELETE is the same for the DELETE (a lease writes nothing).
    The log was allocated ahead of its records (``wal_prealloc_bytes``), so none of those
    fsyncs has a file size to record (on ext4: no journal commit to wait for)."""
    engine, server = served
    attachment = attach(server.data_dir, queue="jobs", capacity=8)
    ring = ClientRing(attachment.mm, spin_us=0.0)
    steps = Steps()
    n = 30
    try:
        for i in range(5):  # the queue's first writes are not what is counted
            assert put(ring, f"w{i}".encode())[0] == Status.OK
        fileio.FAULTS.append(steps)
        try:
            for i in range(n):
                assert put(ring, f"v{i}".encode())[0] == Status.OK
            puts, steps.seen = steps.seen, []
            find = codec.encode_find(1, 0, None)
            for _ in range(n):
                got = ring.call(Op.FIND, find, b"", timeout_s=WAIT_S)
                (d,) = codec.decode_deliveries(got.body)
                done = ring.call(Op.DELETE, *codec.encode_item(d.id, d.receipt), timeout_s=WAIT_S)
                assert done.status == Status.OK
            pairs = steps.seen
        finally:
            fileio.FAULTS.remove(steps)
    finally:
        ring.close()
        attachment.close()
    session = {name for _, _, name in puts}
    assert len(session) == 1 and session.pop().startswith("dq-shm-"), puts
    for seen in (puts, pairs):
        assert sorted({(step, kind) for step, kind, _ in seen}) == [
            ("fsync", "log"),
            ("write", "log"),
        ], seen
        assert sum(step == "fsync" for step, _, _ in seen) == n, seen
        assert sum(step == "write" for step, _, _ in seen) == n, seen
        assert {name for _, _, name in seen} == {name for _, _, name in puts}, seen
    assert len(steps.synced_sizes) == 2 * n
    assert len(set(steps.synced_sizes)) == 1, steps.synced_sizes
    assert engine.stats("jobs").pending == 5


def test_concurrent_ring_writers_share_the_leaders_rounds(
    served: tuple[Engine, ShmServer],
) -> None:
    """Four clients writing at once: every write durable and answered once; the rounds
    run on the sessions' threads (whoever leads), the syncer thread taking only what a
    leader leaves past its passes."""
    engine, server = served
    where = Where()
    fileio.FAULTS.append(where)
    errors: list[BaseException] = []

    def producer(n: int) -> None:
        attachment = attach(server.data_dir, queue="jobs", capacity=8)
        ring = ClientRing(attachment.mm, spin_us=0.0)
        try:
            for i in range(50):
                assert put(ring, f"p{n}-{i}".encode())[0] == Status.OK
        except BaseException as exc:  # reported by the test
            errors.append(exc)
        finally:
            ring.close()
            attachment.close()

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        fileio.FAULTS.remove(where)
    assert errors == []
    assert not any(t.is_alive() for t in threads)
    assert engine.stats("jobs").pending == 200
    names = {name for _, name in where.threads}
    # the sessions lead; only what arrives past a leader's passes goes to the syncer
    assert any(name.startswith("dq-shm-") for name in names), names
    assert all(name.startswith("dq-shm-") or name == "dq-syncer" for name in names), names
    fsyncs = sum(step == "fsync" for step, _ in where.threads)
    assert 1 <= fsyncs <= 200


def test_a_full_disk_in_a_led_round_is_answered_and_nothing_is_kept(
    served: tuple[Engine, ShmServer],
) -> None:
    """The round a session leads fails as the syncer's would: the write is refused with
    ``storage_full``, nothing of it is delivered, and the next write succeeds."""
    _, server = served
    attachment = attach(server.data_dir, queue="jobs", capacity=8)
    ring = ClientRing(attachment.mm, spin_us=0.0)
    try:
        with OneShot("append", "write", "log", errno.ENOSPC).armed() as fault:
            status, body = put(ring, b"lost")
        assert fault.fired is not None
        assert status == Status.STORAGE_FULL, body
        assert put(ring, b"kept")[0] == Status.OK
        found = ring.call(Op.FIND, codec.encode_find(10, 0, None), b"", timeout_s=WAIT_S)
        assert [d.value for d in codec.decode_deliveries(found.body)] == [b"kept"]
    finally:
        ring.close()
        attachment.close()


class _Target:
    """A queue stand-in: each sync round notes its thread and may give another queue to
    the leader meanwhile, as a session writing while the leader syncs does."""

    def __init__(self, syncer: Syncer, then: list[_Target]) -> None:
        self.syncer, self.then = syncer, then
        self.threads: list[str] = []

    def sync_round(self) -> float:
        self.threads.append(threading.current_thread().name)
        if self.then:
            assert self.syncer.lead([self.then.pop(0)]) == 0  # the leader takes it
        return 0.0


def test_a_leader_runs_at_most_its_passes_and_leaves_the_rest_to_the_syncer() -> None:
    """A writer leading keeps no client waiting behind others for ever: what arrives
    after ``LEAD_PASSES`` passes is the syncer thread's; nothing is lost."""
    syncer = Syncer("always", 50)
    try:
        chain: list[_Target] = []
        targets = [_Target(syncer, chain) for _ in range(LEAD_PASSES + 2)]
        chain.extend(targets[1:])
        assert syncer.lead([targets[0]]) == LEAD_PASSES
        deadline = time.monotonic() + WAIT_S
        while not targets[-1].threads and time.monotonic() < deadline:
            time.sleep(0.01)
        leader = threading.current_thread().name
        assert [t.threads for t in targets[:LEAD_PASSES]] == [[leader]] * LEAD_PASSES
        assert [t.threads for t in targets[LEAD_PASSES:]] == [["dq-syncer"]] * 2
    finally:
        syncer.stop()
