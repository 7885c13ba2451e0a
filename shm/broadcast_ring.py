"""The broadcast ring (docs/shm.md): one writer, many readers, nobody misses a message.

Owns the byte layout and the wraparound protocol of docs/shm.md ("Broadcast ring"). The
original design gives the mechanism, not the bytes; ours: a 64-byte header (magic ``DQBR``,
version, the Message Counter, the Wraparound Sync bitmask, the active-readers bitmask,
buffer size, the writer's cursor), a table of 64 readers (pid, state, messages seen),
then the circular buffer of messages, each a u16 length and that many bytes. An empty
message, or fewer than 2 bytes left, marks the end of the buffer. Before it wraps the
writer resets the sync mask, marks the end, bumps the counter and waits until every
active reader has set its sync bit: no reader loses a message.

Deviation (docs/shm.md): a reader that dies, or stops making progress for
``evict_after_s``, is dropped from the active mask so the writer never waits forever;
an evicted reader finds its bit gone after its next read and raises ``SubscriberEvicted``
instead of reading over a lap it missed. Invariant: a reader returns only messages
copied while its bit was set, in publication order, each exactly once.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

from dq.shm import _atomics as A
from dq.shm.errors import ProtocolError, RingClosed, RingFullError, ShmError

__all__ = [
    "HEADER",
    "MAGIC",
    "MAX_READERS",
    "BroadcastReader",
    "BroadcastWriter",
    "SubscriberEvicted",
    "init_ring",
    "ring_size",
]

MAGIC = 0x52425144  # b"DQBR" little-endian
VERSION = 1
# magic, version, message counter, wraparound sync, active readers, buffer size,
# reserved, cursor (counter low 32 << 32 | offset), writer pid, readers asleep, laps, reserved
HEADER = struct.Struct("<IIQQQIIQIIII")
HEADER_SIZE = 64
assert HEADER.size == HEADER_SIZE
OFF_COUNTER, OFF_SYNC, OFF_ACTIVE, OFF_SIZE = 8, 16, 24, 32
OFF_CURSOR, OFF_WRITER, OFF_ASLEEP, OFF_LAPS = 40, 48, 52, 56
MAX_READERS = 64
READER = struct.Struct("<IIQ")  # pid, state, messages seen
READERS_OFF = HEADER_SIZE
BUFFER_OFF = READERS_OFF + MAX_READERS * READER.size
R_FREE, R_ACTIVE, R_EVICTED = 0, 1, 2
MAX_MESSAGE = 0xFFFF
LEN = struct.Struct("<H")


class SubscriberEvicted(ShmError):
    """The writer dropped this reader (it was too slow or looked dead): it may have
    missed messages and must subscribe again."""


def ring_size(buffer_size: int) -> int:
    return BUFFER_OFF + buffer_size


def init_ring(buf: Any, buffer_size: int) -> None:
    if not 64 <= buffer_size <= 1 << 30:
        raise ValueError("buffer_size out of range")
    if len(buf) < ring_size(buffer_size):
        raise ValueError("buffer smaller than the ring")
    A.store_u32(buf, 0, 0)
    buf[4 : ring_size(buffer_size)] = bytes(ring_size(buffer_size) - 4)
    HEADER.pack_into(buf, 0, 0, VERSION, 0, 0, 0, buffer_size, 0, 0, os.getpid(), 0, 0, 0)
    A.fence()
    A.store_u32(buf, 0, MAGIC)


def check_header(buf: Any) -> int:
    """Validate magic, version and size; returns the buffer size."""
    if len(buf) < BUFFER_OFF:
        raise ProtocolError("buffer too small for the broadcast header", size=len(buf))
    magic = A.load_u32(buf, 0)
    if magic != MAGIC:
        raise ProtocolError("not a broadcast ring", magic=hex(magic))
    version = A.load_u32(buf, 4)
    if version != VERSION:
        raise ProtocolError("unsupported broadcast ring version", version=version)
    size = A.load_u32(buf, OFF_SIZE)
    if size < 64 or len(buf) < ring_size(size):
        raise ProtocolError("buffer size out of range", size=size)
    return int(size)


def _alive(pid: int) -> bool:
    if pid == 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _update_mask(buf: Any, off: int, bit: int, on: bool) -> None:
    while True:
        old = A.load_u64(buf, off)
        new = old | bit if on else old & ~bit
        if old == new or A.cas_u64(buf, off, old, new):
            return


class BroadcastWriter:
    """The one writer (the server). ``publish`` may wait at a wraparound, bounded by
    ``evict_after_s`` per stuck reader."""

    def __init__(
        self,
        buf: Any,
        *,
        evict_after_s: float = 10.0,
        check_s: float = 0.05,
        stopping: Callable[[], bool] | None = None,
    ) -> None:
        self.buf = buf
        self.stopping = stopping  # a wrap wait gives up (RingClosed) once this says so
        self.size = check_header(buf)
        self.evict_after_s = evict_after_s
        self.check_s = check_s
        self.offset = 0
        self.counter = A.load_u64(buf, OFF_COUNTER)
        self.evicted = 0
        self.laps = 0

    def has_readers(self) -> bool:
        """Whether any subscriber is active (one load: cheap enough for every event)."""
        return bool(A.load_u64(self.buf, OFF_ACTIVE))

    def publish(self, messages: Sequence[bytes]) -> None:
        """Append ``messages`` in order; readers see them after one counter store."""
        buf, size, base = self.buf, self.size, BUFFER_OFF
        off, pending = self.offset, 0
        for msg in messages:
            n = len(msg)
            if n == 0 or n > MAX_MESSAGE or n + 2 > size:
                raise ValueError(f"message of {n} bytes cannot be broadcast")
            if off + 2 + n > size:
                self._commit(off, pending)
                pending = 0
                self._wrap(off)
                off = 0
            buf[base + off + 2 : base + off + 2 + n] = msg
            LEN.pack_into(buf, base + off, n)
            off += 2 + n
            pending += 1
        self._commit(off, pending)

    def _commit(self, off: int, count: int) -> None:
        if not count:
            return
        buf = self.buf
        self.counter += count
        self.offset = off
        A.store_u64(buf, OFF_COUNTER, self.counter)  # counter first, cursor second: see
        A.store_u64(buf, OFF_CURSOR, (self.counter & 0xFFFFFFFF) << 32 | off)  # _snapshot
        A.fence()
        if A.load_u32(buf, OFF_ASLEEP):
            A.futex_wake(buf, OFF_COUNTER, 1 << 30)

    def _wrap(self, off: int) -> None:
        """The original design's steps 2-5 and 9: reset sync, mark the end, count it, wait."""
        buf = self.buf
        A.store_u64(buf, OFF_SYNC, 0)
        if self.size - off >= 2:
            LEN.pack_into(buf, BUFFER_OFF + off, 0)
        self.counter += 1
        A.store_u64(buf, OFF_COUNTER, self.counter)
        A.store_u64(buf, OFF_CURSOR, (self.counter & 0xFFFFFFFF) << 32)  # next: head
        A.fence()
        A.futex_wake(buf, OFF_COUNTER, 1 << 30)
        self._wait_for_readers()
        self.laps += 1
        A.store_u32(buf, OFF_LAPS, self.laps & 0xFFFFFFFF)

    def _wait_for_readers(self) -> None:
        buf = self.buf
        progress: dict[int, tuple[tuple[int, int], float]] = {}
        while True:
            active = A.load_u64(buf, OFF_ACTIVE)
            missing = active & ~A.load_u64(buf, OFF_SYNC)
            if not missing:
                return
            if self.stopping is not None and self.stopping():
                raise RingClosed("the writer is stopping")
            A.futex_wait(buf, OFF_SYNC, A.load_u32(buf, OFF_SYNC), self.check_s)
            now = time.monotonic()
            for i in range(MAX_READERS):
                if not missing >> i & 1:
                    continue
                pid, _, seen = READER.unpack_from(buf, READERS_OFF + i * READER.size)
                if pid == 0:
                    # the entry is changing hands (a reader leaving, another joining):
                    # ``missing`` may be stale, so judge it on the next look, never now
                    continue
                last = progress.get(i)
                if last is None or last[0] != (pid, seen):
                    progress[i] = ((pid, seen), now)
                stuck = now - progress[i][1] >= self.evict_after_s
                if stuck or not _alive(pid):
                    self._evict(i)

    def _evict(self, index: int) -> None:
        buf = self.buf
        _update_mask(buf, OFF_ACTIVE, 1 << index, False)
        A.store_u32(buf, READERS_OFF + index * READER.size + 4, R_EVICTED)
        self.evicted += 1


class BroadcastReader:
    """One subscriber: registers a bit, reads every message from its join point on."""

    def __init__(self, buf: Any, *, poll_s: float = 0.05) -> None:
        self.buf = buf
        self.size = check_header(buf)
        self.poll_s = poll_s
        self.index = self._register()
        self.bit = 1 << self.index
        self.entry = READERS_OFF + self.index * READER.size
        # Join: become active first, then learn where the writer is. Positioned at the
        # head (a wrap is waiting, or nothing was written yet), we are caught up: say so.
        # Positioned before an end mark, we set the sync bit when we read the mark.
        _update_mask(buf, OFF_ACTIVE, self.bit, True)
        self.count, self.offset = self._snapshot()
        if self.offset == 0:
            _update_mask(buf, OFF_SYNC, self.bit, True)
            A.futex_wake(buf, OFF_SYNC, 1)
        self.closed = False

    def _snapshot(self) -> tuple[int, int]:
        """(messages before the writer's offset, that offset), read consistently: the
        writer stores the counter then the cursor, so equal low words mean a match."""
        buf = self.buf
        for _ in range(1_000_000):
            c1 = A.load_u64(buf, OFF_COUNTER)
            cursor = A.load_u64(buf, OFF_CURSOR)
            c2 = A.load_u64(buf, OFF_COUNTER)
            if c1 == c2 and cursor >> 32 == c1 & 0xFFFFFFFF:
                offset = cursor & 0xFFFFFFFF
                if offset > self.size:
                    raise ProtocolError("writer cursor beyond the buffer", offset=offset)
                return int(c1), int(offset)
        raise ProtocolError("writer cursor never settles")

    def _register(self) -> int:
        buf, me = self.buf, os.getpid()
        for i in range(MAX_READERS):
            off = READERS_OFF + i * READER.size
            state = A.load_u32(buf, off + 4)
            if state != R_FREE:
                if state == R_ACTIVE or _alive(A.load_u32(buf, off)):
                    continue
                if not A.cas_u32(buf, off + 4, state, R_FREE):  # a dead reader's entry
                    continue
            if A.cas_u32(buf, off + 4, R_FREE, R_ACTIVE):
                A.store_u32(buf, off, me)
                A.store_u64(buf, off + 8, 0)
                return i
        raise RingFullError("no free broadcast reader entry", readers=MAX_READERS)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        buf = self.buf
        _update_mask(buf, OFF_ACTIVE, self.bit, False)
        A.store_u32(buf, self.entry, 0)
        A.store_u32(buf, self.entry + 4, R_FREE)
        A.futex_wake(buf, OFF_SYNC, 1)

    def poll(self, timeout_s: float = 0.0, max_messages: int = 100_000) -> list[bytes]:
        """Return the next messages in order (possibly none after ``timeout_s``)."""
        if self.closed:
            raise RingClosed("subscriber closed")
        buf, size, base = self.buf, self.size, BUFFER_OFF
        give_up = time.monotonic() + timeout_s
        out: list[bytes] = []
        while not out:
            counter = A.load_u64(buf, OFF_COUNTER)
            start = self.count
            while self.count < counter and len(out) < max_messages:
                off = self.offset
                n = LEN.unpack_from(buf, base + off)[0] if size - off >= 2 else 0
                if n == 0:  # end of buffer: signal, then wait for the counter to move on
                    self.count += 1
                    self._check_active()
                    _update_mask(buf, OFF_SYNC, self.bit, True)
                    A.futex_wake(buf, OFF_SYNC, 1)
                    self.offset = 0
                    continue
                if off + 2 + n > size:
                    if out:
                        break  # hand over what is good; the next poll reports this
                    self._check_active()
                    raise ProtocolError("message runs past the buffer", offset=off, length=n)
                out.append(bytes(buf[base + off + 2 : base + off + 2 + n]))
                self.offset = off + 2 + n
                self.count += 1
            if self.count != start:
                self._check_active()  # everything copied above is valid only if still active
                A.store_u64(buf, self.entry + 8, self.count)
                if out:
                    return out
            left = give_up - time.monotonic()
            if left <= 0:
                self._check_active()
                if not _alive(A.load_u32(buf, OFF_WRITER)):
                    raise RingClosed(
                        "the broadcasting server is gone", writer=A.load_u32(buf, OFF_WRITER)
                    )
                return out
            self._sleep(counter, min(left, self.poll_s))
        return out

    def _check_active(self) -> None:
        if not A.load_u64(self.buf, OFF_ACTIVE) & self.bit:
            self.closed = True
            A.store_u32(self.buf, self.entry + 4, R_FREE)
            raise SubscriberEvicted("the writer dropped this subscriber", reader=self.index)

    def _sleep(self, counter: int, timeout_s: float) -> None:
        buf = self.buf
        A.fetch_add_u32(buf, OFF_ASLEEP, 1)
        try:
            A.fence()
            if A.load_u64(buf, OFF_COUNTER) == counter:
                A.futex_wait(buf, OFF_COUNTER, counter & 0xFFFFFFFF, timeout_s)
        finally:
            A.fetch_sub_u32(buf, OFF_ASLEEP, 1)
