"""The command ring (docs/shm.md): layout, field codecs and the slot hand-off on both sides.

Owns the byte layout of ``docs/shm.md`` ("Command ring") and the client's side of the
hand-off; the server's side is compiled (``shm/_session.c``: the same offsets, the
decoding of each op and the encoding of its answer) and which engine call an op becomes
lives in ``shm/command_handler.py``. Layout, all little-endian:

    header (24 bytes)   head u64 | tail u64 | capacity u64
    slot i at 24 + 2080*i:
        0     ready u8 (atomic)         1    op u8           2   key [16]
        18    value_size u32            22   value [1024]
        1046  response_size u32         1050 response [1024]
        2074  response_ready u8 (atomic)      2075 padding [5]

Invariants kept here:
  - the client writes a slot only at ``head`` and only while ``(head + 1) % capacity != tail``;
    it sets ``ready = 1`` (release) after every other field, then stores ``head`` (release);
  - the server never trusts shared ``head``/``tail``/``capacity``: it keeps its own tail and
    capacity, checks ``head < capacity``, and copies a slot before looking at its fields,
    so a client rewriting its slot mid-command can only hurt itself;
  - the server publishes ``response_size``/``response`` before ``response_ready = 1``
    (release), and that before it advances ``tail`` (release): responses come in order.

Waking (see "Atomics and waking"): a client that advanced ``head`` futex-wakes the word at
offset 0 (low half of ``head``); the server futex-wakes the aligned word at slot offset 2072,
which holds ``response_ready``.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum

from dq.shm import _atomics as at
from dq.shm.errors import (
    ProtocolError,
    RingClosed,
    RingFullError,
    RingTimeout,
    ValueTooLargeForRing,
)
from dq.storage.errors import status_for_code

__all__ = [
    "DEFAULT_SPIN_US",
    "HEADER",
    "MAX_CAPACITY",
    "RESPONSE_BODY_MAX",
    "SLOT_SIZE",
    "VALUE_MAX",
    "ClientRing",
    "Op",
    "Response",
    "Status",
    "ring_size",
]

HEADER = struct.Struct("<QQQ")  # head, tail, capacity
assert HEADER.size == 24

HEAD_OFF = 0
TAIL_OFF = 8
CAPACITY_OFF = 16
SLOTS_OFF = 24

SLOT_SIZE = 2080
READY = 0
OP = 1
KEY = 2
KEY_SIZE = 16
VALUE_SIZE = 18
VALUE = 22
VALUE_MAX = 1024
RESPONSE_SIZE = 1046
RESPONSE = 1050
RESPONSE_MAX = 1024
RESPONSE_READY = 2074
RESPONSE_WAKE_WORD = 2072  # aligned u32 holding response_ready: the client parks on it
PADDING = 2075

U32 = struct.Struct("<I")
assert RESPONSE_READY + 1 + 5 == SLOT_SIZE
assert VALUE + VALUE_MAX == RESPONSE_SIZE
assert RESPONSE + RESPONSE_MAX == RESPONSE_READY

RESPONSE_HEAD = struct.Struct("<BBH")  # status, flags, reserved
assert RESPONSE_HEAD.size == 4
#: a slot's op, key and value_size (bytes 1..21), written with one pack
SLOT_HEAD = struct.Struct("<B16sI")
#: a slot's response_size and the response's head (bytes 1046..1053), read with one unpack
RESPONSE_TOP = struct.Struct("<IBBH")
assert OP + SLOT_HEAD.size == VALUE and RESPONSE_SIZE + RESPONSE_TOP.size == RESPONSE + 4
RESPONSE_BODY_MAX = RESPONSE_MAX - RESPONSE_HEAD.size
FLAG_MORE = 0x01  # the body continues: send Op.CONTINUE for the next chunk
#: FIND only (a client that does not know them ignores them, as it ignores reserved bits):
FLAG_NO_QUEUE = 0x02  # the queue does not exist (yet): nothing comes until it is created
FLAG_DRAINING = 0x04  # the server is shutting down: its long-polls end at once
#: each delivery carries its group (``group_len`` u8 after ``value_len``, the group after
#: the value): set on the FIND answers of a ring whose client asked at attach ("groups")
FLAG_GROUPS = 0x08

MAX_CAPACITY = 4096
CONTINUE_WINDOW = 32  # continuation chunks a client asks for at once
#: How often a client waiting for a response checks that the server is still there (its
#: attach socket still open): a server that died answers nothing, and its client should
#: hear so within this, not at the end of its timeout and the long-poll's wait.
LIVENESS_S = 0.25

#: How long a waiting side spins before it parks on the futex. Spinning saves the ~3-5 us
#: of a futex wake only when a core is free for it; on the 2-vCPU machine of
#: bench/NOTES.md it cost 3-5x in p50 (the spinner starves the side it waits for),
#: so small machines park at once.
DEFAULT_SPIN_US = 20.0 if (os.cpu_count() or 1) > 2 else 0.0


class Op(IntEnum):
    """Operation codes; 0..2 are the original design's PUT, DELETE, FIND."""

    PUT = 0  # enqueue one item
    DELETE = 1  # release one delivery
    FIND = 2  # dequeue up to count items
    REQUEUE = 3
    EXTEND = 4
    STATS = 5
    BIND = 6  # choose the queue the following commands act on
    CONTINUE = 7  # next chunk of the previous response
    PART = 8  # the next piece of the following command's body; answered with that command
    PUT_MANY = 9  # enqueue a batch in one command (its body spans PART slots)
    DELETE_MANY = 10  # release a batch in one command


class Status(IntEnum):
    """First byte of every response; the names are the HTTP API's stable error codes."""

    OK = 0
    INVALID_ARGUMENT = 1
    INVALID_QUEUE_NAME = 2
    VALUE_TOO_LARGE = 3
    INVALID_DEADLINE = 4
    INVALID_RECEIPT = 5
    BATCH_TOO_LARGE = 6
    QUEUE_NOT_FOUND = 7
    ITEM_NOT_FOUND = 8
    STALE_RECEIPT = 9
    CONFIG_CONFLICT = 10
    STORAGE_FULL = 11
    UNAVAILABLE = 12
    NOT_BOUND = 13
    UNKNOWN_OP = 14
    MALFORMED = 15
    INTERNAL = 16
    NO_CONTINUATION = 17
    #: this server is a follower of a replicated deployment; the body is the leader's URL
    NOT_LEADER = 18
    #: this server is a follower and knows no leader now (an election is running)
    NO_LEADER = 19
    #: the write may or may not commit: its replicas did not confirm it in time
    REPLICATION_TIMEOUT = 20
    #: refused before anything was written: the replicas acknowledge nothing (retry later)
    REPLICATION_STALLED = 21
    INVALID_KEY = 22  # an idempotency key the server refuses (PUT_MANY)
    TOO_MANY_QUEUES = 23
    #: a field outside its range (``storage/validation.py``), as HTTP's 422
    VALIDATION_ERROR = 24

    @property
    def code(self) -> str:
        """The error code string, as the HTTP API and the storage errors spell it."""
        return self.name.lower()

    @property
    def http_status(self) -> int:
        """The status the HTTP API answers for this code (``dq.storage.errors``: the one
        mapping); the ring's own refusals (not bound, unknown op, malformed) are 400."""
        if self is Status.INTERNAL:
            return 500
        if self is Status.NOT_LEADER:
            return 421
        if self in (Status.NO_LEADER, Status.REPLICATION_TIMEOUT):
            return 503
        status = status_for_code(self.code)
        return 400 if status == 500 else status


def ring_size(capacity: int) -> int:
    """Bytes of a ring with ``capacity`` slots (the original design's ``24 + 2080 * N``)."""
    return SLOTS_OFF + SLOT_SIZE * capacity


def slot_offset(index: int) -> int:
    return SLOTS_OFF + SLOT_SIZE * index


@dataclass(slots=True)  # not frozen: one per answer, and a frozen one costs ~3x to build
class Response:
    status: int
    flags: int
    body: bytes

    @property
    def more(self) -> bool:
        return bool(self.flags & FLAG_MORE)


class ClientRing:
    """The client's side of one ring: fill a slot at ``head``, then wait for its response.

    Thread-safe: one lock serialises use of the ring, as the design's single producer requires.
    """

    def __init__(
        self,
        mm: mmap.mmap,
        *,
        spin_us: float = DEFAULT_SPIN_US,
        server_gone: Callable[[], bool] | None = None,
    ) -> None:
        self._mm = mm
        self._server_gone = server_gone
        self._view = memoryview(mm)
        capacity = at.load_u64(mm, CAPACITY_OFF)
        if not 2 <= capacity <= MAX_CAPACITY or ring_size(capacity) > len(mm):
            raise ProtocolError("ring capacity out of range", capacity=capacity)
        self.capacity = capacity
        self.spin_us = spin_us
        self.lock = threading.Lock()
        self.closed = False
        #: set once ``server_gone`` said so: every later wait fails at once
        self.server_lost = False

    def close(self) -> None:
        self.closed = True
        self._view.release()

    def free_slots(self) -> int:
        head = at.load_u64(self._mm, HEAD_OFF)
        tail = at.load_u64(self._mm, TAIL_OFF)
        return (tail - head - 1) % self.capacity

    def submit(
        self, op: int, key: bytes, value: bytes, timeout_s: float = 30.0, *, wake: bool = True
    ) -> int:
        """Fill the slot at ``head`` and publish it; returns the slot index. Caller holds lock.
        With ``wake=False`` the server is not woken: a caller filling several slots wakes
        it once at the end (``wake_server``), so the server takes them in one pass."""
        if len(value) > VALUE_MAX:
            raise ValueTooLargeForRing("value does not fit a command slot", size=len(value))
        if len(key) != KEY_SIZE:
            raise ValueError("key must be 16 bytes")
        mm, view = self._mm, self._view
        head = at.load_u64(mm, HEAD_OFF)
        if head >= self.capacity:  # only this client writes it; a server may scribble
            raise ProtocolError("head out of range", head=head, capacity=self.capacity)
        nxt = (head + 1) % self.capacity
        if nxt == at.load_u64(mm, TAIL_OFF):
            self._wait_for_room(nxt, timeout_s)
        off = SLOTS_OFF + SLOT_SIZE * head
        at.store_u8(mm, off + READY, 0)
        SLOT_HEAD.pack_into(view, off + OP, op, key, len(value))
        view[off + VALUE : off + VALUE + len(value)] = value
        U32.pack_into(view, off + RESPONSE_SIZE, 0)
        at.store_u8(mm, off + RESPONSE_READY, 0)
        at.store_u8(mm, off + READY, 1)
        at.store_u64(mm, HEAD_OFF, nxt)
        if wake:
            at.futex_wake(mm, HEAD_OFF, 1)
        return head

    def submit_span(
        self, slots: list[tuple[int, bytes, bytes]], timeout_s: float = 30.0
    ) -> list[int]:
        """Fill consecutive slots (a command's PARTs, then the op) and publish them with
        one store of ``head``, without waking the server; their indexes. Caller holds
        lock. With fewer free slots than that, slot by slot (``submit``) instead."""
        mm, view, capacity = self._mm, self._view, self.capacity
        head = at.load_u64(mm, HEAD_OFF)
        if (at.load_u64(mm, TAIL_OFF) - head - 1) % capacity < len(slots):
            return [self.submit(op, key, value, timeout_s, wake=False) for op, key, value in slots]
        indexes = []
        for op, key, value in slots:
            if len(value) > VALUE_MAX:
                raise ValueTooLargeForRing("value does not fit a command slot", size=len(value))
            if len(key) != KEY_SIZE:
                raise ValueError("key must be 16 bytes")
            off = slot_offset(head)
            at.store_u8(mm, off + READY, 0)
            SLOT_HEAD.pack_into(view, off + OP, op, key, len(value))
            view[off + VALUE : off + VALUE + len(value)] = value
            U32.pack_into(view, off + RESPONSE_SIZE, 0)
            at.store_u8(mm, off + RESPONSE_READY, 0)
            at.store_u8(mm, off + READY, 1)
            indexes.append(head)
            head = (head + 1) % capacity
        at.store_u64(mm, HEAD_OFF, head)
        return indexes

    def wake_server(self) -> None:
        """Wake the server to take the commands submitted with ``wake=False``."""
        at.futex_wake(self._mm, HEAD_OFF, 1)

    def _wait_for_room(self, nxt: int, timeout_s: float) -> None:
        """The ring is full. The server advances ``tail`` right after publishing a response
        and does not wake anyone for it, so spin and nap in 1 ms slices (a rare path: the
        client transport keeps at most ``capacity - 1`` commands in flight)."""
        end = time.monotonic() + timeout_s
        while nxt == at.load_u64(self._mm, TAIL_OFF):
            if self.closed or time.monotonic() > end:
                raise RingFullError("no free slot", capacity=self.capacity)
            at.spin_wait_u64(self._mm, TAIL_OFF, nxt, 0.001, 100.0)

    def wait(self, index: int, timeout_s: float = 30.0, *, parked: bool = False) -> Response:
        """Wait for the response in slot ``index`` and copy it out. Caller holds lock.
        ``parked``: the caller waited one slice already (``exchange``), so the server's
        liveness is checked at once."""
        mm = self._mm
        off = slot_offset(index)
        end = time.monotonic() + timeout_s
        # the first wait costs no liveness check: answers come in microseconds
        spin_us = 0.0 if parked else self.spin_us
        while at.load_u8(mm, off + RESPONSE_READY) == 0:
            if self.closed:
                raise RingClosed("ring closed while waiting for a response")
            if self.server_lost or (parked and self._server_gone and self._server_gone()):
                self.server_lost = True  # no later command can be answered either
                raise RingClosed("the server is gone (it stopped or crashed)", slot=index)
            left = end - time.monotonic()
            if left <= 0:
                raise RingTimeout("no response from the server", slot=index, timeout_s=timeout_s)
            at.spin_wait_u8(mm, off + RESPONSE_READY, 0, min(left, LIVENESS_S), spin_us)
            spin_us, parked = 0.0, True
        return self._response(index)

    def _response(self, index: int) -> Response:
        off = slot_offset(index)
        (size,) = U32.unpack_from(self._view, off + RESPONSE_SIZE)
        if not RESPONSE_HEAD.size <= size <= RESPONSE_MAX:
            raise ProtocolError("response_size out of range", slot=index, size=size)
        raw = bytes(self._view[off + RESPONSE : off + RESPONSE + size])
        status, flags, _ = RESPONSE_HEAD.unpack_from(raw)
        return Response(status, flags, raw[RESPONSE_HEAD.size :])

    def collect(self, indexes: list[int], timeout_s: float = 30.0) -> Response:
        """The response of a command that took the slots ``indexes`` (PARTs, then the op),
        joined. Caller holds lock. The server publishes a command's slots together, the
        last one last: waiting for that one is enough. ``more`` is set when the answer
        did not fit the slots (``complete`` fetches the rest)."""
        last = self.wait(indexes[-1], timeout_s)
        if len(indexes) == 1:
            return last
        mm = self._mm
        parts = []
        status = None
        for index in indexes[:-1]:  # up to the first chunk the answer does not go on from
            if at.load_u8(mm, slot_offset(index) + RESPONSE_READY) != 1:
                raise ProtocolError("a command's slot answered out of order", slot=index)
            chunk = self._response(index)
            status = chunk.status if status is None else status
            parts.append(chunk.body)
            if not chunk.more:
                return Response(status, chunk.flags, b"".join(parts))
        parts.append(last.body)
        return Response(last.status if status is None else status, last.flags, b"".join(parts))

    def call(self, op: int, key: bytes, value: bytes = b"", timeout_s: float = 30.0) -> Response:
        """One command and its whole response (following continuations)."""
        with self.lock:
            return self.call_locked(op, key, value, timeout_s)

    def call_locked(
        self, op: int, key: bytes, value: bytes = b"", timeout_s: float = 30.0
    ) -> Response:
        """``call`` for a caller that already holds ``lock``."""
        return Response(*self.exchange(op, key, value, timeout_s))

    def exchange(
        self, op: int, key: bytes, value: bytes = b"", timeout_s: float = 30.0
    ) -> tuple[int, int, bytes]:
        """One command of one slot and its whole answer as (status, flags, body), without
        a ``Response``: the one-item calls' round trip (``client/shm_transport.py``).
        Caller holds lock. The first wait and the read of the answer are ``wait`` and
        ``_response`` written out (one futex park, one unpack, one copy); a wait past
        its first slice, a continued answer and every failure take their usual path."""
        index = self.submit(op, key, value, timeout_s)
        mm = self._mm
        off = SLOTS_OFF + SLOT_SIZE * index
        ready = off + RESPONSE_READY
        first = min(timeout_s, LIVENESS_S)
        if at.load_u8(mm, ready) == 0 and not (self.closed or self.server_lost):
            at.spin_wait_u8(mm, ready, 0, first, self.spin_us)
        if at.load_u8(mm, ready) == 0:  # slow, closed or gone: the checks of ``wait``
            left = max(timeout_s - first, 0.0)
            r = self.complete(self.wait(index, left, parked=True), timeout_s)
            return r.status, r.flags, r.body
        size, status, flags, _ = RESPONSE_TOP.unpack_from(self._view, off + RESPONSE_SIZE)
        if not RESPONSE_HEAD.size <= size <= RESPONSE_MAX:
            raise ProtocolError("response_size out of range", slot=index, size=size)
        body = bytes(self._view[off + RESPONSE + RESPONSE_HEAD.size : off + RESPONSE + size])
        if flags & FLAG_MORE:
            r = self.complete(Response(status, flags, body), timeout_s)
            return r.status, r.flags, r.body
        return status, flags, body

    def complete(self, first: Response, timeout_s: float = 30.0) -> Response:
        """``first`` with the rest of its body. Caller holds lock. The CONTINUEs are
        pipelined, 1, 2, 4 ... (up to ``CONTINUE_WINDOW``) at a time; those sent past
        the last chunk are answered NO_CONTINUATION and dropped."""
        if not first.more:
            return first
        parts = [first.body]
        inflight: deque[int] = deque()
        window, last = 1, False
        while True:
            while not last and len(inflight) < window:
                inflight.append(self.submit(Op.CONTINUE, bytes(KEY_SIZE), b"", timeout_s))
            if not inflight:  # the first chunk's flags, but MORE
                return Response(first.status, first.flags & ~FLAG_MORE, b"".join(parts))
            response = self.wait(inflight.popleft(), timeout_s)
            if last:
                continue
            if response.status != Status.OK:
                raise ProtocolError("a continuation failed", status=response.status)
            parts.append(response.body)
            last = not response.more
            window = min(window * 2, CONTINUE_WINDOW, self.capacity - 1)
