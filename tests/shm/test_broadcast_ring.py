"""The broadcast ring (docs/shm.md): the doc's bytes, no reader misses a message, eviction."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing as mp
import os
import signal
import struct
import threading
import time

import pytest

from dq.shm import _atomics as A
from dq.shm.broadcast_ring import (
    BUFFER_OFF,
    HEADER,
    MAGIC,
    OFF_ACTIVE,
    OFF_CURSOR,
    BroadcastReader,
    BroadcastWriter,
    SubscriberEvicted,
    init_ring,
    ring_size,
)
from dq.shm.errors import ProtocolError, RingClosed
from tests.shm.doc_examples import doc_example
from tests.stopped import sigstop

CTX = mp.get_context("fork")


def make(size: int = 4096) -> mmap.mmap:
    buf = mmap.mmap(-1, ring_size(size))
    init_ring(buf, size)
    return buf


def test_doc_example_bytes() -> None:
    buf = make(64)
    reader = BroadcastReader(buf)
    BroadcastWriter(buf).publish([b"hi", b"abc"])
    header, data = doc_example("broadcast-header"), doc_example("broadcast-buffer")
    fields = HEADER.unpack(header)
    assert fields[0] == MAGIC and header[:4] == b"DQBR"
    assert fields[1:6] == (1, 2, 1, 1, 64)  # version, counter, sync, active, size
    assert fields[7] == 2 << 32 | 9  # cursor: 2 messages, next at offset 9
    assert bytes(buf[8:48]) == header[8:48]  # everything but the writer's pid
    assert bytes(buf[BUFFER_OFF : BUFFER_OFF + len(data)]) == data
    assert struct.unpack_from("<H", data)[0] == 2 and data[2:4] == b"hi"
    assert reader.poll() == [b"hi", b"abc"]


def test_one_reader_sees_everything_across_wraps_in_order() -> None:
    buf = make(64)
    reader = BroadcastReader(buf)
    writer = BroadcastWriter(buf, evict_after_s=30)
    got: list[bytes] = []

    def read() -> None:
        give_up = time.monotonic() + 30
        while len(got) < 200 and time.monotonic() < give_up:
            got.extend(reader.poll(timeout_s=0.1))

    thread = threading.Thread(target=read)
    thread.start()
    for i in range(200):
        writer.publish([b"m%d" % i])
    thread.join(30)
    assert got == [b"m%d" % i for i in range(200)]
    assert writer.laps > 10
    assert writer.evicted == 0


def test_a_reader_joining_late_sees_a_contiguous_suffix() -> None:
    buf = make(64)
    writer = BroadcastWriter(buf)
    writer.publish([b"%03d" % i for i in range(10)])
    reader = BroadcastReader(buf)
    writer.publish([b"%03d" % i for i in range(10, 12)])
    assert reader.poll() == [b"010", b"011"]


# ---- many processes --------------------------------------------------------------------


def _read_all(buf: mmap.mmap, count: int, slow: bool, ready: object, out: object) -> None:
    reader = BroadcastReader(buf)
    ready.release()  # type: ignore[attr-defined]
    expected, errors = 0, 0
    give_up = time.monotonic() + 120
    while expected < count and time.monotonic() < give_up:
        for msg in reader.poll(timeout_s=0.5, max_messages=50 if slow else 100_000):
            errors += struct.unpack_from("<Q", msg)[0] != expected
            expected += 1
        if slow:
            time.sleep(0.001)
    out.put((slow, expected, errors))  # type: ignore[attr-defined]


def _write_all(buf: mmap.mmap, count: int) -> None:
    writer = BroadcastWriter(buf, evict_after_s=60)
    batch: list[bytes] = []
    for seq in range(count):
        batch.append(struct.pack("<Q", seq) + b"x" * (seq % 23))
        if len(batch) == 64:
            writer.publish(batch)
            batch = []
    writer.publish(batch)
    os._exit(0 if writer.evicted == 0 else 3)


@pytest.mark.integration
def test_four_readers_one_slow_see_every_message_in_order() -> None:
    count = 50_000
    buf = make(8192)
    ready, out = CTX.Semaphore(0), CTX.Queue()
    readers = [
        CTX.Process(target=_read_all, args=(buf, count, i == 0, ready, out)) for i in range(4)
    ]
    for r in readers:
        r.start()
    for _ in readers:
        assert ready.acquire(timeout=30)
    writer = CTX.Process(target=_write_all, args=(buf, count))
    writer.start()
    results = [out.get(timeout=150) for _ in readers]
    writer.join(30)
    for r in readers:
        r.join(10)
    assert writer.exitcode == 0  # nobody was evicted
    assert sorted(results) == [(False, count, 0)] * 3 + [(True, count, 0)]


# ---- dead and stuck readers --------------------------------------------------------------


def _register_and_wait(buf: mmap.mmap, ready: object, evicted: object) -> None:
    reader = BroadcastReader(buf)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(1.0)  # SIGSTOPped here in the stuck-reader test
    try:
        while True:
            reader.poll(timeout_s=0.1)
    except SubscriberEvicted:
        evicted.set()  # type: ignore[attr-defined]


@pytest.mark.integration
def test_a_killed_reader_is_dropped_and_does_not_stall_the_writer() -> None:
    buf = make(64)
    ready, evicted = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_register_and_wait, args=(buf, ready, evicted))
    proc.start()
    assert ready.wait(10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    writer = BroadcastWriter(buf, evict_after_s=60)
    t0 = time.monotonic()
    writer.publish([b"y" * 20] * 20)  # several wraps
    assert time.monotonic() - t0 < 5
    assert writer.evicted == 1
    assert A.load_u64(buf, OFF_ACTIVE) == 0
    BroadcastReader(buf).close()  # its entry is reusable


@pytest.mark.integration
def test_a_stuck_reader_is_evicted_and_told_so() -> None:
    buf = make(64)
    ready, evicted = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_register_and_wait, args=(buf, ready, evicted))
    proc.start()
    try:
        assert ready.wait(10)
        sigstop(proc.pid)
        writer = BroadcastWriter(buf, evict_after_s=0.3)
        t0 = time.monotonic()
        writer.publish([b"z" * 20] * 20)
        assert 0.25 < time.monotonic() - t0 < 5
        assert writer.evicted == 1
        os.kill(proc.pid, signal.SIGCONT)
        assert evicted.wait(10)  # it learns it may have missed messages
    finally:
        proc.kill()
        proc.join(10)


# ---- hostile bytes ---------------------------------------------------------------------


def test_bad_headers_are_refused() -> None:
    buf = make(64)
    struct.pack_into("<I", buf, 0, 0xDEADBEEF)
    with pytest.raises(ProtocolError):
        BroadcastReader(buf)
    buf = make(64)
    struct.pack_into("<I", buf, 4, 9)
    with pytest.raises(ProtocolError):
        BroadcastWriter(buf)
    buf = make(64)
    struct.pack_into("<I", buf, 32, 1 << 29)  # size beyond the mapping
    with pytest.raises(ProtocolError):
        BroadcastReader(buf)
    buf = make(64)
    A.store_u64(buf, OFF_CURSOR, 1 << 20)  # a cursor beyond the buffer
    with pytest.raises(ProtocolError):
        BroadcastReader(buf)
    with pytest.raises(ProtocolError):
        BroadcastReader(mmap.mmap(-1, 100))


def test_a_garbage_length_is_a_protocol_error_not_a_crash() -> None:
    buf = make(64)
    reader = BroadcastReader(buf)
    writer = BroadcastWriter(buf)
    writer.publish([b"ok"])
    struct.pack_into("<H", buf, BUFFER_OFF + 4, 60_000)  # the next message's length
    A.store_u64(buf, 8, 2)  # and a counter that claims it exists
    assert reader.poll() == [b"ok"]
    with pytest.raises(ProtocolError):
        reader.poll()


def test_a_gone_writer_is_reported() -> None:
    buf = make(64)
    reader = BroadcastReader(buf)
    assert reader.poll(timeout_s=0.01) == []  # the writer (this process) is alive
    struct.pack_into("<I", buf, 48, 0)  # no writer process
    with pytest.raises(RingClosed):
        reader.poll(timeout_s=0.01)


def test_message_size_limits() -> None:
    writer = BroadcastWriter(make(64))
    with pytest.raises(ValueError):
        writer.publish([b""])
    with pytest.raises(ValueError):
        writer.publish([b"x" * 63])


def _write_until_stopped(buf: mmap.mmap, stop: object) -> None:
    writer = BroadcastWriter(buf, evict_after_s=60)
    seq = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        writer.publish([struct.pack("<Q", s) + b"j" * (s % 13) for s in range(seq, seq + 16)])
        seq += 16
    os._exit(0)


def _join_late(buf: mmap.mmap, delay: float, out: object) -> None:
    time.sleep(delay)
    reader = BroadcastReader(buf)
    seqs: list[int] = []
    give_up = time.monotonic() + 60
    while len(seqs) < 20_000 and time.monotonic() < give_up:
        seqs.extend(struct.unpack_from("<Q", m)[0] for m in reader.poll(timeout_s=0.5))
    reader.close()
    gaps = sum(b != a + 1 for a, b in itertools.pairwise(seqs))
    out.put((len(seqs), gaps))  # type: ignore[attr-defined]


@pytest.mark.integration
def test_readers_joining_mid_stream_see_contiguous_messages() -> None:
    buf = make(512)  # wraps every few dozen messages
    stop, out = CTX.Event(), CTX.Queue()
    writer = CTX.Process(target=_write_until_stopped, args=(buf, stop))
    writer.start()
    readers = [CTX.Process(target=_join_late, args=(buf, 0.05 * i, out)) for i in range(4)]
    try:
        for r in readers:
            r.start()
        results = [out.get(timeout=90) for _ in readers]
    finally:
        stop.set()
        writer.join(30)
        for r in readers:
            r.join(10)
    assert all(n >= 20_000 and gaps == 0 for n, gaps in results), results


def test_a_reader_entry_changing_hands_is_not_evicted() -> None:
    """The writer's view of who is missing can be stale: a reader that left may already
    have handed its entry to a newcomer, whose pid is not written yet (0). Such an entry
    must be looked at again, never judged dead on the spot (a newcomer was evicted so)."""
    from dq.shm.broadcast_ring import OFF_SYNC, R_ACTIVE, READER, READERS_OFF

    buf = make(64)
    writer = BroadcastWriter(buf, evict_after_s=60, check_s=0.01)
    entry = READERS_OFF + 3 * READER.size
    A.store_u32(buf, entry + 4, R_ACTIVE)  # claimed, pid not stored yet
    A.store_u64(buf, OFF_ACTIVE, 1 << 3)
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (writer._wait_for_readers(), done.set()))
    waiter.start()
    time.sleep(0.2)  # the writer looks at the entry many times meanwhile
    assert A.load_u64(buf, OFF_ACTIVE) == 1 << 3 and writer.evicted == 0
    A.store_u32(buf, entry, os.getpid())  # the newcomer finishes joining and catches up
    A.store_u64(buf, OFF_SYNC, 1 << 3)
    A.futex_wake(buf, OFF_SYNC, 1)
    waiter.join(timeout=10)
    assert done.is_set() and writer.evicted == 0
