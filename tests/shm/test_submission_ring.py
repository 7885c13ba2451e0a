"""The WPOL submission ring (docs/shm.md): the doc's bytes, many producers, hostile content."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import struct
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from dq.shm import _atomics as A
from dq.shm import subscriber
from dq.shm.errors import (
    ProtocolError,
    RingClosed,
    RingFullError,
    RingTimeout,
    ValueTooLargeForRing,
)
from dq.shm.submission_drain import SubmissionDrainer
from dq.shm.submission_ring import (
    DONE,
    HEADER,
    MAGIC,
    NO_SLOT,
    RESULT,
    SLOT,
    BadMagic,
    SubmissionRing,
    VersionMismatch,
    init_ring,
    ring_size,
)
from dq.shm.submitter import SubmissionRejected, Submitter
from dq.storage import Engine, EngineConfig
from dq.storage.errors import WriteStall
from dq.storage.types import NewItem
from tests.server.live import live_server
from tests.shm.doc_examples import doc_example

CTX = mp.get_context("fork")


def make(capacity: int = 8, payload: int = 256) -> mmap.mmap:
    buf = mmap.mmap(-1, ring_size(capacity, payload))
    init_ring(buf, capacity, payload)
    return buf


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    eng = Engine.open(tmp_path / "data", EngineConfig(fsync="never"))
    yield eng
    eng.close()


def test_doc_example_bytes() -> None:
    buf = make(2, 136)
    A.store_u32(buf, 36, 4242)  # the doc's server pid
    sub = Submitter(buf)
    slot = sub.submit("jobs", b"hello", delay_ms=1500)
    A.store_u32(buf, sub.ring.slot_off(slot) + 32, 4243)  # the doc's producer pid
    assert bytes(buf[:64]) == doc_example("submission-header")
    assert bytes(buf[64:80]) == doc_example("submission-entries")
    assert bytes(buf[80:144]) == doc_example("submission-slot")
    assert bytes(buf[208:217]) == doc_example("submission-payload")
    fields = HEADER.unpack(doc_example("submission-header"))
    assert fields[0] == MAGIC and fields[1] == 1
    assert (fields[2], fields[3], fields[4], fields[5]) == (0, 1, 2, 1)  # head tail cap mask
    assert (fields[8], fields[9], fields[10]) == (80, 136, 1)  # slots base, P, free head
    entry = struct.unpack("<Q", doc_example("submission-entries")[:8])[0]
    assert (entry >> 32, entry & 0xFFFFFFFF) == (1, 0)
    done = SLOT.unpack(doc_example("submission-done"))
    assert done[0] == DONE and done[-2:] == (1, 1_800_000_001_500)
    # the server's completion, as in the doc, reads back through the producer's wait
    RESULT.pack_into(buf, 80 + 48, 1, 1_800_000_001_500)
    A.store_u32(buf, 80, DONE)
    assert bytes(buf[80:144]) == doc_example("submission-done")
    assert sub.wait(slot, timeout_s=1).id == 1


def test_ring_operations_follow_the_original_error_table() -> None:
    buf = make(2)
    ring = SubmissionRing(buf)
    a, b = ring.allocate(), ring.allocate()
    assert (a, b) == (0, 1)
    assert ring.allocate() is None  # "no free slots": head == 0xFFFFFFFF
    assert A.load_u32(buf, 48) == NO_SLOT
    assert ring.pop() is None  # "buffer empty"
    assert ring.push(a) and ring.push(b)
    assert not ring.push(a)  # "buffer full": tail - head >= capacity
    assert [ring.pop(), ring.pop(), ring.pop()] == [1 << 32 | 0, 1 << 32 | 1, None]
    ring.free(b)
    ring.free(a)
    assert A.load_u32(buf, 32) == 0  # allocated count back to 0
    assert ring.allocate() == a


def test_bad_magic_version_and_geometry_are_refused() -> None:
    buf = make()
    struct.pack_into("<I", buf, 0, 0x12345678)
    with pytest.raises(BadMagic):
        SubmissionRing(buf)
    buf = make()
    struct.pack_into("<I", buf, 4, 2)
    with pytest.raises(VersionMismatch):
        SubmissionRing(buf)
    for off, value in [(24, 6), (28, 5), (40, 7), (24, 1 << 20)]:
        buf = make()
        struct.pack_into("<I", buf, off, value)
        with pytest.raises(ProtocolError):
            SubmissionRing(buf)
    with pytest.raises(ProtocolError):
        SubmissionRing(mmap.mmap(-1, 32))


def test_hostile_entries_and_slots_never_reach_the_engine(engine: Engine) -> None:
    buf = make(8)
    ring = SubmissionRing(buf)
    sub = Submitter(buf)
    # an entry naming a slot beyond the ring, and one naming a free slot
    for bogus in (1 << 32 | 1000, 1 << 32 | 5):
        t = A.load_u64(buf, 16)
        A.store_u64(buf, 64 + (t & 7) * 8, bogus)
        A.store_u64(buf, 16, t + 1)
    # a slot whose lengths run past the payload, one with a bad queue name
    for qlen, name in ((4, b"jobs"), (3, b"../")):
        index = ring.allocate()
        assert index is not None
        off = ring.slot_off(index)
        buf[ring.payload_off(index) : ring.payload_off(index) + len(name)] = name
        struct.pack_into("<IIQII", buf, off + 8, 1, 10_000 if name == b"jobs" else 1, 0, 1, 1)
        struct.pack_into("<H", buf, off + 40, qlen)
        A.store_u32(buf, off, 2)
        assert ring.push(index)
    drainer = SubmissionDrainer(engine, buf).start()
    try:
        good = sub.enqueue("jobs", b"fine", timeout_s=10)
        give_up = time.monotonic() + 10
        while drainer.stats.malformed < 2 and time.monotonic() < give_up:
            time.sleep(0.01)
    finally:
        drainer.close()
    assert drainer.stats.malformed == 2
    assert drainer.stats.failed == 2  # both bad slots were failed with a code
    assert engine.list_queues() == ["jobs"]
    assert [d.value for d in engine.dequeue("jobs", 10)] == [b"fine"]
    assert good.id == 1


def test_engine_refusals_come_back_as_codes(engine: Engine, tmp_path: Path) -> None:
    small = Engine.open(tmp_path / "small", EngineConfig(fsync="never", max_value_bytes=4))
    buf = make(8)
    drainer = SubmissionDrainer(small, buf).start()
    try:
        sub = Submitter(buf)
        with pytest.raises(SubmissionRejected) as err:
            sub.enqueue("jobs", b"too long", timeout_s=10)
        assert err.value.code == "value_too_large"
        assert sub.enqueue("jobs", b"ok", timeout_s=10).id == 1
        with pytest.raises(ValueTooLargeForRing):
            sub.submit("jobs", b"x" * 300)
    finally:
        drainer.close()
        small.close()


def test_corrupt_header_makes_the_drainer_reset_the_ring(engine: Engine) -> None:
    buf = make(8)
    drainer = SubmissionDrainer(engine, buf).start()
    try:
        sub = Submitter(buf)
        assert sub.enqueue("q", b"1", timeout_s=10).id == 1
        A.store_u64(buf, 8, 1 << 40)  # head far beyond tail
        give_up = time.monotonic() + 10
        while drainer.stats.resets == 0 and time.monotonic() < give_up:
            time.sleep(0.01)
        assert drainer.stats.resets == 1
        assert Submitter(buf).enqueue("q", b"2", timeout_s=10).id == 2
    finally:
        drainer.close()
    assert [d.value for d in engine.dequeue("q", 10)] == [b"1", b"2"]


def test_no_server_means_a_bounded_wait() -> None:
    sub = Submitter(make(2))
    slot = sub.submit("q", b"x")
    with pytest.raises(RingTimeout):
        sub.wait(slot, timeout_s=0.1)
    sub.submit("q", b"y")
    with pytest.raises(RingFullError):
        sub.submit("q", b"z", timeout_s=0.1)


def _die_holding_slots(buf: mmap.mmap, done: object) -> None:
    sub = Submitter(buf)
    sub.ring.allocate()  # allocated, never submitted
    sub.submit("q", b"orphan")  # submitted, never waited for
    done.set()  # type: ignore[attr-defined]
    os._exit(0)


@pytest.mark.integration
def test_slots_of_a_killed_producer_are_reclaimed(engine: Engine) -> None:
    buf = make(4)
    done = CTX.Event()
    proc = CTX.Process(target=_die_holding_slots, args=(buf, done))
    proc.start()
    assert done.wait(10)
    proc.join(10)
    assert A.load_u32(buf, 32) == 2
    drainer = SubmissionDrainer(engine, buf).start()
    try:
        give_up = time.monotonic() + 10
        while A.load_u32(buf, 32) != 0 and time.monotonic() < give_up:
            time.sleep(0.05)
        assert A.load_u32(buf, 32) == 0
        assert drainer.stats.reaped == 2
    finally:
        drainer.close()
    assert [d.value for d in engine.dequeue("q", 10)] == [b"orphan"]


# ---- four producer processes, 50,000 items each ----------------------------------------


def _produce(buf: mmap.mmap, n: int, count: int, go: object, out: Connection) -> None:
    go.wait(30)  # type: ignore[attr-defined]
    sub = Submitter(buf)
    done = sub.enqueue_many("stress", (b"p%d-%d" % (n, i) for i in range(count)), window=128)
    out.send([d.id for d in done])
    os._exit(0)


@pytest.mark.integration
def test_four_producers_each_item_exactly_once(tmp_path: Path) -> None:
    producers, count = 4, 50_000
    buf = make(1024, 256)
    go = CTX.Event()
    pipes = [CTX.Pipe(duplex=False) for _ in range(producers)]
    procs = [
        CTX.Process(target=_produce, args=(buf, n, count, go, pipes[n][1]))
        for n in range(producers)
    ]
    for p in procs:
        p.start()  # forked before the engine's threads exist
    eng = Engine.open(tmp_path / "data", EngineConfig(fsync="interval", fsync_interval_ms=20))
    drainer = SubmissionDrainer(eng, buf).start()
    try:
        go.set()
        results = {}
        for n, (reader, _) in enumerate(pipes):
            assert reader.poll(200), f"producer {n} did not finish"
            results[n] = reader.recv()
        for p in procs:
            p.join(30)
        ids = [i for n in range(producers) for i in results[n]]
        assert len(ids) == len(set(ids)) == producers * count
        values: list[bytes] = []
        while batch := eng.dequeue("stress", 1000, lease_ms=600_000):
            values.extend(d.value for d in batch)
        assert len(values) == producers * count
        assert set(values) == {b"p%d-%d" % (n, i) for n in range(producers) for i in range(count)}
        assert drainer.stats.malformed == 0 and drainer.stats.failed == 0
    finally:
        drainer.close()
        eng.close()
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join(10)


def _produce_forever(buf: mmap.mmap, n: int, out: Connection) -> None:
    sub = Submitter(buf)
    i = 0
    while True:  # killed by the test at a random moment
        sub.enqueue_many("kill", (b"k%d-%d" % (n, j) for j in range(i, i + 64)), window=32)
        i += 64
        out.send(i)


@pytest.mark.integration
def test_producers_killed_mid_push_never_wedge_or_duplicate(tmp_path: Path) -> None:
    buf = make(64, 256)
    pipes = [CTX.Pipe(duplex=False) for _ in range(3)]
    procs = [CTX.Process(target=_produce_forever, args=(buf, n, pipes[n][1])) for n in range(3)]
    for p in procs:
        p.start()
    eng = Engine.open(tmp_path / "data", EngineConfig(fsync="never"))
    drainer = SubmissionDrainer(eng, buf).start()
    try:
        acked = [0, 0, 0]
        for round_ in range(3):  # kill each producer in turn, wherever it is
            reader = pipes[round_][0]
            # once it has pushed something (a loaded machine may be slow to run it)
            if reader.poll(10):
                acked[round_] = reader.recv()
            time.sleep(0.05 + 0.05 * round_)
            procs[round_].kill()
            procs[round_].join(10)
        for n, (reader, _) in enumerate(pipes):
            while reader.poll(0):
                acked[n] = reader.recv()
        # the ring still works, and a survivor's item goes through
        assert Submitter(buf).enqueue("kill", b"after", timeout_s=30).id > 0
        give_up = time.monotonic() + 10
        while A.load_u32(buf, 32) != 0 and time.monotonic() < give_up:
            time.sleep(0.05)  # dead producers' slots come back
        assert A.load_u32(buf, 32) == 0
        values: list[bytes] = []
        while batch := eng.dequeue("kill", 1000, lease_ms=600_000):
            values.extend(d.value for d in batch)
        assert len(values) == len(set(values))  # nothing twice
        for n in range(3):  # everything a producer was told is durable is there
            assert {b"k%d-%d" % (n, j) for j in range(acked[n])} <= set(values)
        assert sum(acked) > 0
    finally:
        drainer.close()
        eng.close()
        for p in procs:
            p.kill()
            p.join(10)


class _StallingEngine:
    """A real engine whose queue "stalled" is in a write stall until ``stalled`` is cleared."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.config = engine.config
        self.stalled = True
        self.refused = 0

    def enqueue_nowait(self, queue: str, items: list[NewItem]) -> Any:
        if queue == "stalled" and self.stalled:
            self.refused += 1
            raise WriteStall("segment files are behind", queue=queue)
        return self._engine.enqueue_nowait(queue, items)


def test_a_stalled_queue_holds_up_neither_other_queues_nor_its_own_order(engine: Engine) -> None:
    stalling = _StallingEngine(engine)
    buf = make(16)
    drainer = SubmissionDrainer(stalling, buf).start()
    try:
        sub = Submitter(buf)
        first, second = sub.submit("stalled", b"1"), sub.submit("stalled", b"2")
        t0 = time.monotonic()
        assert sub.enqueue("other", b"x", timeout_s=10).id == 1
        assert time.monotonic() - t0 < 5  # not behind the stalled queue's retries
        deadline = time.monotonic() + 10
        while stalling.refused < 3 and time.monotonic() < deadline:
            time.sleep(0.01)  # the stalled group is being retried meanwhile
        stalling.stalled = False
        assert (sub.wait(first, 10).id, sub.wait(second, 10).id) == (1, 2)
    finally:
        drainer.close()


@pytest.mark.integration
def test_a_producer_whose_server_died_hears_so_at_once(tmp_path: Path) -> None:
    """SIGKILL the server: a producer's next enqueue raises RingClosed ("the server is
    gone") within a poll or two, not RingTimeout at the end of its 30 s timeout."""
    data = tmp_path / "data"
    with live_server(data, env={"DQ_SHM": "1"}) as server:
        producer = subscriber.submitter(data)
        assert producer.enqueue("jobs", b"before").id == 1
        server.kill()
        started = time.monotonic()
        with pytest.raises(RingClosed, match="server is gone"):
            producer.enqueue("jobs", b"after")
        assert time.monotonic() - started < 2
    with live_server(data, env={"DQ_SHM": "1"}):  # and a restart clears its rings
        pass
