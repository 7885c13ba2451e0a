"""The overwrite-oldest telemetry ring (docs/shm.md): a header lock, per-message locks.

Owns the byte layout and the lock protocol of docs/shm.md ("Telemetry ring"), exactly
the design's: magic ``576f726b20697320`` (u64), params ``QUEUE_MAX_LEN``/``MSG_SIZE`` (u32),
header ``HEADER_LOCK`` (u64), ``START_IDX``/``QUEUE_LEN`` (u32), then ``QUEUE_MAX_LEN``
messages of ``MSG_LOCK`` (u64) + ``MSG_SIZE`` u64 words. Enqueue to a full ring
overwrites the oldest message; dequeue takes the oldest, as the original design's diagrams show.

What the original design leaves open, and we fix (docs/shm.md explains): a lock word holds its
holder's token ``pid << 32 | n`` (non-zero), unlock is a CAS from that token, and every
wait is bounded. A lock whose holder is dead is taken over; the writer also takes over a
lock a live reader has held longer than ``steal_after_s`` (a stopped ``dq top`` must not
stall the server). A reader whose unlock CAS fails knows its read may be torn and
retries. Invariant: a reader never returns a torn message; the writer never waits longer
than ``steal_after_s`` per lock.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
from typing import Any

from dq.shm import _atomics as A
from dq.shm.errors import ProtocolError, RingTimeout

__all__ = [
    "HEADER",
    "MAGIC",
    "TelemetryRing",
    "init_ring",
    "ring_size",
]

MAGIC = 0x576F726B20697320  # "Work is " read as a big-endian u64; stored little-endian
# magic, QUEUE_MAX_LEN, MSG_SIZE, HEADER_LOCK, START_IDX, QUEUE_LEN
HEADER = struct.Struct("<QIIQII")
assert HEADER.size == 32
OFF_LOCK, OFF_START, OFF_LEN, MESSAGES = 16, 24, 28, 32
MAX_QUEUE_LEN = 1 << 16
MAX_MSG_SIZE = 1 << 12  # words

_tokens = itertools.count(1)


def ring_size(queue_max_len: int, msg_size: int) -> int:
    return MESSAGES + queue_max_len * (8 + 8 * msg_size)


def init_ring(buf: Any, queue_max_len: int, msg_size: int) -> None:
    """Lay out an empty ring; the magic is written last."""
    if not 1 <= queue_max_len <= MAX_QUEUE_LEN or not 1 <= msg_size <= MAX_MSG_SIZE:
        raise ValueError("QUEUE_MAX_LEN or MSG_SIZE out of range")
    size = ring_size(queue_max_len, msg_size)
    if len(buf) < size:
        raise ValueError(f"buffer of {len(buf)} bytes is smaller than the ring ({size})")
    A.store_u64(buf, 0, 0)
    buf[8:size] = bytes(size - 8)
    struct.pack_into("<II", buf, 8, queue_max_len, msg_size)
    A.fence()
    A.store_u64(buf, 0, MAGIC)


def _token() -> int:
    return os.getpid() << 32 | (next(_tokens) & 0xFFFFFFFF or 1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class TelemetryRing:
    """The telemetry ring's operations on one mapped buffer, with bounded lock waits."""

    def __init__(self, buf: Any, *, steal_after_s: float = 0.01, timeout_s: float = 1.0) -> None:
        if len(buf) < MESSAGES:
            raise ProtocolError("buffer too small for the telemetry header", size=len(buf))
        magic = A.load_u64(buf, 0)
        if magic != MAGIC:
            raise ProtocolError("not a telemetry ring", magic=hex(magic))
        qmax, msg = (int(x) for x in struct.unpack_from("<II", buf, 8))
        if not 1 <= qmax <= MAX_QUEUE_LEN or not 1 <= msg <= MAX_MSG_SIZE:
            raise ProtocolError("QUEUE_MAX_LEN or MSG_SIZE out of range", max_len=qmax, size=msg)
        if len(buf) < ring_size(qmax, msg):
            raise ProtocolError("ring larger than its buffer", size=ring_size(qmax, msg))
        self.buf = buf
        self.queue_max_len = qmax
        self.msg_size = msg
        self.msg_bytes = 8 * msg
        self.stride = 8 + self.msg_bytes
        self.steal_after_s = steal_after_s
        self.timeout_s = timeout_s
        self.stolen = 0  # locks this handle took over (dead or stuck holders)

    def msg_off(self, index: int) -> int:
        return MESSAGES + index * self.stride

    # ---- locks -------------------------------------------------------------------------

    def lock(self, off: int, *, steal: bool) -> int:
        """Take the lock word at ``off``; returns our token. Bounded: a dead holder's lock
        is taken over at once, a live holder's after ``steal_after_s`` if ``steal``,
        else ``RingTimeout`` after ``timeout_s``."""
        buf, token = self.buf, _token()
        if A.cas_u64(buf, off, 0, token):
            return token
        start = time.monotonic()
        spins = 0
        while True:
            holder = A.load_u64(buf, off)
            if holder == 0:
                if A.cas_u64(buf, off, 0, token):
                    return token
                continue
            waited = time.monotonic() - start
            if (not _alive(holder >> 32) or (steal and waited >= self.steal_after_s)) and A.cas_u64(
                buf, off, holder, token
            ):
                self.stolen += 1
                return token
            if not steal and waited >= self.timeout_s:
                raise RingTimeout("telemetry lock held too long", offset=off, holder=holder >> 32)
            spins += 1
            if spins > 50:
                time.sleep(0.0002)

    def unlock(self, off: int, token: int) -> bool:
        """Release; False if someone took the lock over meanwhile (our read may be torn)."""
        return A.cas_u64(self.buf, off, token, 0)

    # ---- the design's two operations -----------------------------------------------------

    def enqueue(self, data: bytes) -> int:
        """Writer: append ``data`` (padded to MSG_SIZE words); overwrite the oldest when
        full. Returns the message index written."""
        if len(data) > self.msg_bytes:
            raise ValueError(f"message of {len(data)} bytes exceeds MSG_SIZE words")
        buf, qmax = self.buf, self.queue_max_len
        htok = self.lock(OFF_LOCK, steal=True)
        while True:  # CAS, not a store: a reader we took the lock from may still write
            word = A.load_u64(buf, OFF_START)
            start, length = word & 0xFFFFFFFF, word >> 32
            if start >= qmax or length > qmax:  # hostile header: start over empty
                start, length = 0, 0
            if length < qmax:
                index, new = (start + length) % qmax, start | (length + 1) << 32
            else:
                index, new = start, (start + 1) % qmax | length << 32
            if A.cas_u64(buf, OFF_START, word, new):
                break
        off = self.msg_off(index)
        mtok = self.lock(off, steal=True)
        self.unlock(OFF_LOCK, htok)
        buf[off + 8 : off + 8 + len(data)] = data
        if len(data) < self.msg_bytes:
            buf[off + 8 + len(data) : off + self.stride] = bytes(self.msg_bytes - len(data))
        self.unlock(off, mtok)
        return int(index)

    def dequeue(self, wait_s: float = 0.0) -> bytes | None:
        """Reader: take the oldest message (None if empty after ``wait_s``)."""
        buf, qmax = self.buf, self.queue_max_len
        give_up = time.monotonic() + wait_s
        while True:
            while A.load_u32(buf, OFF_LEN) == 0:
                if time.monotonic() >= give_up:
                    return None
                time.sleep(0.001)
            htok = self.lock(OFF_LOCK, steal=False)
            word = A.load_u64(buf, OFF_START)
            start, length = word & 0xFFFFFFFF, word >> 32
            if length == 0 or start >= qmax or length > qmax:
                self.unlock(OFF_LOCK, htok)
                if length == 0:
                    continue
                raise ProtocolError("telemetry header out of range", start=start, length=length)
            # CAS from what we read: if the writer took our lock over and moved on, retry.
            if not A.cas_u64(buf, OFF_START, word, (start + 1) % qmax | (length - 1) << 32):
                self.unlock(OFF_LOCK, htok)
                continue
            off = self.msg_off(start)
            mtok = self.lock(off, steal=False)
            if not self.unlock(OFF_LOCK, htok):
                # The writer took the header over while we held it (we were held up
                # between taking this message and locking it): it may have written the
                # slot again since, with a newer message; this one is lost to us.
                self.unlock(off, mtok)
                continue
            data = bytes(buf[off + 8 : off + self.stride])
            if self.unlock(off, mtok):
                return data
            # The writer took the lock over: this copy may be torn and the slot rewritten;
            # the message is lost to us (overwrite-oldest), read the next one.

    def peek(self) -> list[bytes]:
        """Reader (ours, for ``dq top``): copy every message oldest first, without
        removing any; each under its own lock. Torn copies are dropped."""
        buf, qmax = self.buf, self.queue_max_len
        htok = self.lock(OFF_LOCK, steal=False)
        start, length = struct.unpack_from("<II", buf, OFF_START)
        self.unlock(OFF_LOCK, htok)
        if start >= qmax or length > qmax:
            raise ProtocolError("telemetry header out of range", start=start, length=length)
        out = []
        for k in range(length):
            off = self.msg_off((start + k) % qmax)
            mtok = self.lock(off, steal=False)
            data = bytes(buf[off + 8 : off + self.stride])
            if self.unlock(off, mtok):
                out.append(data)
        return out

    def header(self) -> tuple[int, int, int]:
        """(HEADER_LOCK, START_IDX, QUEUE_LEN) as they are now, unlocked (diagnostics)."""
        _, _, _, lock, start, length = HEADER.unpack_from(self.buf, 0)
        return lock, start, length
