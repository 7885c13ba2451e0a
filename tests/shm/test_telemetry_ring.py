"""The telemetry ring (docs/shm.md): the doc's bytes, the design's diagrams, torn reads, locks."""

from __future__ import annotations

import mmap
import multiprocessing as mp
import os
import signal
import struct
import threading
import time

import pytest

from dq.shm import _atomics as A
from dq.shm.errors import ProtocolError, RingTimeout
from dq.shm.telemetry_ring import (
    MAGIC,
    MESSAGES,
    OFF_LOCK,
    OFF_START,
    TelemetryRing,
    init_ring,
    ring_size,
)
from tests.shm.doc_examples import doc_example
from tests.stopped import sigstop

CTX = mp.get_context("fork")


def make(qmax: int = 5, msg: int = 3, **kw: float) -> TelemetryRing:
    buf = mmap.mmap(-1, ring_size(qmax, msg))
    init_ring(buf, qmax, msg)
    return TelemetryRing(buf, **kw)


def word(ch: str) -> bytes:
    return (ch.encode() * 8) * 3  # "aaa" in the diagrams: three words


def state(ring: TelemetryRing) -> tuple[int, int, int, list[str]]:
    """(HEADER_LOCK, START_IDX, QUEUE_LEN, message letters) like a diagram row."""
    lock, start, length = ring.header()
    letters = []
    for i in range(ring.queue_max_len):
        off = ring.msg_off(i)
        assert A.load_u64(ring.buf, off) == 0, "every MSG_LOCK is '.' after an operation"
        data = bytes(ring.buf[off + 8 : off + ring.stride])
        letters.append("." if data == bytes(24) else chr(data[0]) * 3)
    return lock, start, length, letters


def test_doc_example_bytes() -> None:
    raw = doc_example("telemetry-ring")
    ring = make(2, 1)
    ring.enqueue(struct.pack("<Q", 42))
    assert bytes(ring.buf[: len(raw)]) == raw
    magic, qmax, msg, lock, start, length = struct.unpack_from("<QIIQII", raw)
    assert (magic, qmax, msg, lock, start, length) == (MAGIC, 2, 1, 0, 0, 1)
    assert raw[:8] == bytes.fromhex("576f726b20697320")[::-1]
    assert struct.unpack_from("<QQ", raw, 32) == (0, 42)


# The design's diagrams, QUEUE_LEN=5, MSG_SIZE=3, row by row in the design's notation:
# [HEADER_LOCK START_IDX QUEUE_LEN] then {MSG_LOCK data} per message. A recording ring
# snapshots the rows at every lock and unlock (before and after), so the test sees each
# intermediate state; consecutive equal rows collapse, as in "Read MSG_0 data".


class Recorder(TelemetryRing):
    def __init__(self, buf: mmap.mmap) -> None:
        super().__init__(buf)
        self.rows: list[str] = [row(self)]

    def _note(self) -> None:
        r = row(self)
        if r != self.rows[-1]:
            self.rows.append(r)

    def lock(self, off: int, *, steal: bool) -> int:
        token = super().lock(off, steal=steal)
        self._note()
        return token

    def unlock(self, off: int, token: int) -> bool:
        self._note()
        ok = super().unlock(off, token)
        self._note()
        return ok


def row(ring: TelemetryRing) -> str:
    lock, start, length = ring.header()
    cells = [f"[{'X' if lock else '.'} {start} {length}]"]
    for i in range(ring.queue_max_len):
        off = ring.msg_off(i)
        data = bytes(ring.buf[off + 8 : off + ring.stride])
        letters = "..." if data == bytes(24) else chr(data[0]) * 3
        cells.append(f"{{{'X' if A.load_u64(ring.buf, off) else '.'} {letters}}}")
    return "  ".join(cells)


def diagram(text: str) -> list[str]:
    rows = [" ".join(line.split("#")[0].split()) for line in text.strip().splitlines()]
    out: list[str] = []
    for r in rows:
        if not out or r != out[-1]:
            out.append(r)
    return out


def recorder(start: int, length: int, letters: str) -> Recorder:
    buf = mmap.mmap(-1, ring_size(5, 3))
    init_ring(buf, 5, 3)
    struct.pack_into("<II", buf, OFF_START, start, length)
    for i, ch in enumerate(letters):
        if ch != ".":
            off = MESSAGES + i * 32
            buf[off + 8 : off + 32] = word(ch)
    return Recorder(buf)


def check(rec: Recorder, text: str) -> None:
    assert [" ".join(r.split()) for r in rec.rows] == diagram(text)


def test_enqueue_to_empty() -> None:
    rec = recorder(0, 0, ".....")
    assert rec.enqueue(word("a")) == 0
    check(
        rec,
        """
        [. 0 0]  {. ...}  {. ...}  {. ...}  {. ...}  {. ...}    # Queue is empty
        [X 0 0]  {. ...}  {. ...}  {. ...}  {. ...}  {. ...}    # Lock header
        [X 0 1]  {X ...}  {. ...}  {. ...}  {. ...}  {. ...}    # Increment QUEUE_LEN, lock MSG_0
        [. 0 1]  {X ...}  {. ...}  {. ...}  {. ...}  {. ...}    # Unlock header
        [. 0 1]  {X aaa}  {. ...}  {. ...}  {. ...}  {. ...}    # Write MSG_0 data
        [. 0 1]  {. aaa}  {. ...}  {. ...}  {. ...}  {. ...}    # Unlock MSG_0
    """,
    )


def test_enqueue_to_full_overwrites_the_oldest() -> None:
    rec = recorder(0, 5, "abcde")
    assert rec.enqueue(word("f")) == 0
    check(
        rec,
        """
        [. 0 5]  {. aaa}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Queue is full
        [X 0 5]  {. aaa}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Lock header
        [X 1 5]  {X aaa}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Increment START_IDX, lock MSG_0
        [. 1 5]  {X aaa}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Unlock header
        [. 1 5]  {X fff}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Rewrite MSG_0 data
        [. 1 5]  {. fff}  {. bbb}  {. ccc}  {. ddd}  {. eee}    # Unlock MSG_0
    """,
    )


def test_enqueue_to_full_with_max_shift_cycles_start() -> None:
    rec = recorder(4, 5, "fghie")
    assert rec.enqueue(word("j")) == 4
    check(
        rec,
        """
        [. 4 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {. eee}    # Queue is full and shift is max
        [X 4 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {. eee}    # Lock header
        [X 0 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {X eee}    # Cycle START_IDX, lock MSG_4
        [. 0 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {X eee}    # Unlock header
        [. 0 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {X jjj}    # Rewrite MSG_4 data
        [. 0 5]  {. fff}  {. ggg}  {. hhh}  {. iii}  {. jjj}    # Unlock MSG_4
    """,
    )


def test_dequeue_from_empty_waits_for_a_message() -> None:
    rec = recorder(4, 0, ".....")
    got: list[bytes | None] = []
    reader = threading.Thread(target=lambda: got.append(rec.dequeue(wait_s=10.0)))
    reader.start()
    time.sleep(0.05)
    assert reader.is_alive()  # "wait while QUEUE_LEN == 0"
    assert rec.rows == [row(rec)]  # nothing locked while waiting
    writer = TelemetryRing(rec.buf)
    writer.enqueue(word("k"))
    writer.enqueue(word("l"))
    reader.join(10)
    assert got == [word("k")]
    assert rec.rows[1].startswith("[X 4 2]")  # "Lock header", then "same as below"
    assert " ".join(rec.rows[-1].split()) == "[. 0 1] {. lll} {. ...} {. ...} {. ...} {. kkk}"


def test_dequeue_from_half_full() -> None:
    rec = recorder(0, 3, "abc..")
    assert rec.dequeue() == word("a")
    check(
        rec,
        """
        [. 0 3]  {. aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Queue is half full
        [X 0 3]  {. aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Lock header
        [X 1 2]  {X aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Decrement QUEUE_LEN, increment START_IDX, lock MSG_0
        [. 1 2]  {X aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Unlock header
        [. 1 2]  {X aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Read MSG_0 data
        [. 1 2]  {. aaa}  {. bbb}  {. ccc}  {. ...}  {. ...}    # Unlock MSG_0
    """,
    )


def test_dequeue_from_shifted() -> None:
    rec = recorder(3, 3, "f..de")
    assert rec.dequeue() == word("d")
    check(
        rec,
        """
        [. 3 3]  {. fff}  {. ...}  {. ...}  {. ddd}  {. eee}    # Queue is shifted
        [X 3 3]  {. fff}  {. ...}  {. ...}  {. ddd}  {. eee}    # Lock header
        [X 4 2]  {. fff}  {. ...}  {. ...}  {X ddd}  {. eee}    # Decrement QUEUE_LEN, increment START_IDX, lock MSG_3
        [. 4 2]  {. fff}  {. ...}  {. ...}  {X ddd}  {. eee}    # Unlock header
        [. 4 2]  {. fff}  {. ...}  {. ...}  {X ddd}  {. eee}    # Read MSG_3 data
        [. 4 2]  {. fff}  {. ...}  {. ...}  {. ddd}  {. eee}    # Unlock MSG_3
    """,
    )


def test_dequeue_from_empty_without_waiting_returns_none() -> None:
    assert make().dequeue() is None


# ---- hostile content ------------------------------------------------------------------


def test_bad_magic_and_params_are_refused() -> None:
    buf = mmap.mmap(-1, ring_size(5, 3))
    with pytest.raises(ProtocolError):
        TelemetryRing(buf)
    init_ring(buf, 5, 3)
    struct.pack_into("<I", buf, 8, 1 << 30)  # QUEUE_MAX_LEN beyond the buffer
    with pytest.raises(ProtocolError):
        TelemetryRing(buf)
    with pytest.raises(ProtocolError):
        TelemetryRing(mmap.mmap(-1, 16))


def test_out_of_range_header_recovers_on_write_and_errors_on_read() -> None:
    ring = make()
    struct.pack_into("<II", ring.buf, OFF_START, 99, 77)
    with pytest.raises(ProtocolError):
        ring.peek()
    assert ring.enqueue(word("a")) == 0  # the writer starts over empty
    assert state(ring)[:3] == (0, 0, 1)
    assert ring.dequeue() == word("a")


def _hold_lock_and_die(buf: mmap.mmap, off: int) -> None:
    TelemetryRing(buf).lock(off, steal=False)
    os._exit(0)


@pytest.mark.integration
def test_a_dead_holder_does_not_stall_anyone() -> None:
    ring = make(steal_after_s=10.0, timeout_s=10.0)  # only death may free the lock
    proc = CTX.Process(target=_hold_lock_and_die, args=(ring.buf, OFF_LOCK))
    proc.start()
    proc.join(10)
    assert A.load_u64(ring.buf, OFF_LOCK) >> 32 == proc.pid
    t0 = time.monotonic()
    ring.enqueue(word("a"))
    assert ring.dequeue() == word("a")
    assert time.monotonic() - t0 < 5.0
    assert ring.stolen >= 1


def _hold_lock_forever(buf: mmap.mmap, off: int, ready: object) -> None:
    TelemetryRing(buf).lock(off, steal=False)
    ready.set()  # type: ignore[attr-defined]
    time.sleep(60)


@pytest.mark.integration
def test_a_stopped_reader_does_not_stall_the_writer() -> None:
    ring = make(steal_after_s=0.01, timeout_s=0.2)
    ready = CTX.Event()
    proc = CTX.Process(target=_hold_lock_forever, args=(ring.buf, ring.msg_off(0), ready))
    proc.start()
    try:
        assert ready.wait(10)
        sigstop(proc.pid)
        t0 = time.monotonic()
        ring.enqueue(word("a"))  # message 0: its lock is held by the stopped reader
        assert time.monotonic() - t0 < 1.0
        assert state(ring)[3][0] == "aaa"
        # a reader (not the writer) waits only a bounded time for a live holder
        holder = TelemetryRing(ring.buf, timeout_s=0.05)
        holder.lock(OFF_LOCK, steal=False)
        with pytest.raises(RingTimeout):
            TelemetryRing(ring.buf, timeout_s=0.05).dequeue()
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)


def test_a_reader_held_up_after_taking_a_message_never_returns_a_newer_one_instead() -> None:
    """A reader takes the oldest message off the header, then is held up (descheduled)
    before it locks the message, longer than the writer waits for the header lock: the
    writer takes the header over and writes the freed slot again. The reader must drop
    what it took, not return the newer message in its place (the ring would then run
    backwards for it: "d" before "b" and "c")."""
    ring = make(qmax=3, steal_after_s=0.01)
    for ch in "abc":
        ring.enqueue(word(ch))
    reader = TelemetryRing(ring.buf)
    held, go = threading.Event(), threading.Event()
    real_lock = reader.lock

    def held_up_lock(off: int, *, steal: bool) -> int:
        if off != OFF_LOCK and not held.is_set():
            held.set()
            assert go.wait(10)
        return real_lock(off, steal=steal)

    reader.lock = held_up_lock  # type: ignore[method-assign]
    got: list[bytes | None] = []
    t = threading.Thread(target=lambda: got.append(reader.dequeue()))
    t.start()
    assert held.wait(10)
    ring.enqueue(word("d"))  # takes the header over; slot 0, "a"'s, is free: "d" goes there
    assert ring.stolen == 1
    go.set()
    t.join(10)
    assert got == [word("b")]
    assert [reader.dequeue(), reader.dequeue(), reader.dequeue()] == [word("c"), word("d"), None]


# ---- many processes: readers never see a torn message ----------------------------------


def _writer(buf: mmap.mmap, count: int) -> None:
    ring = TelemetryRing(buf)
    for seq in range(1, count + 1):
        ring.enqueue(struct.pack("<Q", seq) * ring.msg_size)
    os._exit(0)


def _reader(buf: mmap.mmap, mode: str, stop: object, out: object) -> None:
    ring = TelemetryRing(buf, timeout_s=5.0)
    seen, torn, last, backwards = 0, 0, 0, 0
    while not stop.is_set():  # type: ignore[attr-defined]
        msgs = ring.peek() if mode == "peek" else [m for m in [ring.dequeue(0.01)] if m]
        for m in msgs:
            words = struct.unpack(f"<{ring.msg_size}Q", m)
            torn += len(set(words)) != 1
            if mode == "dequeue":
                backwards += words[0] <= last
                last = words[0]
            seen += 1
    out.put((mode, seen, torn, backwards))  # type: ignore[attr-defined]


@pytest.mark.integration
def test_readers_never_see_a_torn_message() -> None:
    qmax, msg = 8, 64
    buf = mmap.mmap(-1, ring_size(qmax, msg))
    init_ring(buf, qmax, msg)
    stop, out = CTX.Event(), CTX.Queue()
    readers = [CTX.Process(target=_reader, args=(buf, m, stop, out)) for m in ("dequeue", "peek")]
    for r in readers:
        r.start()
    writer = CTX.Process(target=_writer, args=(buf, 20_000))
    writer.start()
    writer.join(120)
    stop.set()
    results = [out.get(timeout=30) for _ in readers]
    for r in readers:
        r.join(10)
    assert writer.exitcode == 0
    for mode, seen, torn, backwards in results:
        assert seen > 0, mode
        assert torn == 0, mode
        assert backwards == 0, mode
