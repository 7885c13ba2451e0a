"""The producer side of the submission ring: enqueue without a handshake, learn the id.

Owns what a producer writes into a task slot and how it waits (docs/shm.md, "Submission
ring: what the slots carry"). A producer allocates a slot, writes the queue name and the
value into the slot's payload area and the deadline into the slot, marks it submitted,
pushes the entry, and waits on the slot's state word: the server sets ``DONE`` (with the
item id and stored deadline) only once the item is durable under the server's fsync
mode, or ``FAILED`` with an error code. The producer then frees the slot.

Invariant kept: a slot is written only while this producer holds it (allocated and not
yet pushed) and read back only after the server's release store of ``DONE``/``FAILED``;
every wait is bounded.
"""

from __future__ import annotations

import os
import struct
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from dq.shm import _atomics as A
from dq.shm.errors import RingClosed, RingFullError, RingTimeout, ShmError, ValueTooLargeForRing
from dq.shm.submission_ring import (
    ALLOCATED,
    DONE,
    ENQUEUE_AFTER,
    ENQUEUE_AT,
    FAILED,
    OFF_SERVER_PID,
    PRIORITY,
    RESULT,
    S_ERROR,
    S_ID,
    S_STATE,
    S_WAITING,
    SUBMITTED,
    SubmissionRing,
)
from dq.storage.types import Enqueued, check_queue_name
from dq.storage.validation import NOT_BOTH

__all__ = ["ERROR_CODES", "SubmissionRejected", "Submitter"]

# priority, value length, timestamp, method, reference count, owner pid, waiting,
# queue-name length, error: slot bytes 8..44
FIELDS = struct.Struct("<IIQIIIIHH")
FIELDS_OFF = 8
assert FIELDS.size == 36

ERROR_CODES = {
    1: "invalid_argument",
    2: "value_too_large",
    3: "unavailable",
    4: "malformed_slot",
    5: "invalid_queue_name",
    6: "invalid_deadline",
}


class SubmissionRejected(ShmError):
    """The server refused the item (bad queue name, value too large, engine down)."""

    def __init__(self, code: str, **context: object) -> None:
        super().__init__(f"the server refused the item: {code}", **context)
        self.code = code


def _server_alive(buf: Any) -> bool:
    """Whether the server that made the ring (its pid is in the header) still runs: a
    producer waiting on a server that died hears so at its next poll, not at its timeout
    (30 s by default, and again for every item after)."""
    pid = A.load_u32(buf, OFF_SERVER_PID)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's (not ours to signal)
        return True
    return pid != 0


class Submitter:
    """One producer process's handle on the ring. Not thread-safe: one per thread."""

    def __init__(self, buf: Any, *, poll_s: float = 0.05) -> None:
        self.ring = SubmissionRing(buf)
        self.buf = buf
        self.poll_s = poll_s
        self.max_value = self.ring.geo.payload_size

    def submit(
        self,
        queue: str,
        value: bytes,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
        timeout_s: float = 10.0,
    ) -> int:
        """Hand one item to the server; returns the slot to ``wait`` on."""
        name = check_queue_name(queue).encode("ascii")
        if len(name) + len(value) > self.max_value:
            raise ValueTooLargeForRing(
                "queue name and value exceed the slot payload",
                size=len(value),
                limit=self.max_value,
            )
        if deadline is not None and delay_ms is not None:
            raise ValueError(NOT_BOTH)
        method, stamp = (
            (ENQUEUE_AFTER, delay_ms) if delay_ms is not None else (ENQUEUE_AT, deadline or 0)
        )
        if not 0 <= stamp < 1 << 63:
            raise ValueError("deadline and delay_ms must be non-negative")
        ring, buf = self.ring, self.buf
        give_up = time.monotonic() + timeout_s
        index = ring.allocate()
        while index is None:
            if time.monotonic() > give_up:
                raise RingFullError("no free submission slot", timeout_s=timeout_s)
            time.sleep(0.0005)
            index = ring.allocate()
        off, pay = ring.slot_off(index), ring.payload_off(index)
        buf[pay : pay + len(name)] = name
        buf[pay + len(name) : pay + len(name) + len(value)] = value
        pid = A.load_u32(buf, off + 32)
        FIELDS.pack_into(
            buf, off + FIELDS_OFF, PRIORITY, len(value), stamp, method, 1, pid, 0, len(name), 0
        )
        A.store_u32(buf, off + S_STATE, SUBMITTED)
        while not ring.push(index):
            if time.monotonic() > give_up:
                A.store_u32(buf, off + S_STATE, ALLOCATED)
                ring.free(index)
                raise RingFullError("submission ring full", timeout_s=timeout_s)
            time.sleep(0.0005)
        return index

    def wait(self, index: int, timeout_s: float = 30.0) -> Enqueued:
        """Block until the server reports slot ``index`` durable (or refused); free it."""
        buf, off = self.buf, self.ring.slot_off(index)
        give_up = time.monotonic() + timeout_s
        state = A.load_u32(buf, off + S_STATE)
        parked = False
        while state == SUBMITTED:
            if parked and not _server_alive(buf):
                raise RingClosed("the server is gone (it stopped or crashed)", slot=index)
            left = give_up - time.monotonic()
            if left <= 0:
                raise RingTimeout("no completion from the server", slot=index, timeout_s=timeout_s)
            A.store_u32(buf, off + S_WAITING, 1)
            A.fence()
            state = A.load_u32(buf, off + S_STATE)
            if state != SUBMITTED:
                break
            A.futex_wait(buf, off + S_STATE, SUBMITTED, min(left, self.poll_s))
            state = A.load_u32(buf, off + S_STATE)
            parked = True
        try:
            if state == DONE:
                item_id, stored = RESULT.unpack_from(buf, off + S_ID)
                return Enqueued(item_id, stored)
            if state == FAILED:
                code = struct.unpack_from("<H", buf, off + S_ERROR)[0]
                raise SubmissionRejected(ERROR_CODES.get(code, f"error_{code}"), slot=index)
            raise ShmError("slot changed hands while waiting", slot=index, state=state)
        finally:
            if state in (DONE, FAILED):
                self.ring.free(index)

    def enqueue(
        self,
        queue: str,
        value: bytes,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
        timeout_s: float = 30.0,
    ) -> Enqueued:
        """Submit one item and wait until it is durable; returns its id and deadline."""
        slot = self.submit(queue, value, deadline=deadline, delay_ms=delay_ms, timeout_s=timeout_s)
        return self.wait(slot, timeout_s)

    def enqueue_many(
        self, queue: str, values: Iterable[bytes], *, window: int = 64, timeout_s: float = 30.0
    ) -> list[Enqueued]:
        """Pipeline: keep up to ``window`` items in flight; results in submission order."""
        pending: deque[int] = deque()
        out: list[Enqueued] = []
        for value in values:
            if len(pending) >= window:
                out.append(self.wait(pending.popleft(), timeout_s))
            pending.append(self.submit(queue, value, timeout_s=timeout_s))
        while pending:
            out.append(self.wait(pending.popleft(), timeout_s))
        return out
