"""The server side of the submission ring: drain entries into the engine, report ids.

Owns the drainer thread (docs/shm.md, "Submission ring: completion path"). It pops up to
``max_batch`` entries, checks every slot field (a producer may be buggy or hostile),
groups the items per queue and hands each group to ``engine.enqueue_nowait``: the same
validation, group commit and durability as an HTTP batch. When a group's future
resolves, each slot gets its id and stored deadline and then ``DONE`` (a release store),
and a producer sleeping on the slot is woken. A slot the engine refuses gets ``FAILED``
and an error code.

Invariants kept: nothing in the ring reaches the engine unchecked; a malformed entry or
slot is counted and skipped; a corrupt header makes the drainer re-initialize the ring
(waiting producers time out with a clear error) instead of raising; slots of dead
producers are reclaimed; every wait is bounded so ``close`` returns promptly.

A queue in a write stall (its segment files are being written) does not hold up the
others: its group is parked and retried every ``STALL_RETRY_S`` while the drainer goes on
with everything else; later groups of that queue wait behind it (so a producer's items
keep their order), and after ``STALL_GIVE_UP_S`` they fail with ``unavailable``. A queue
that is unavailable for good (failed, closed) fails its slots at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from dq.shm import _atomics as A
from dq.shm.errors import ProtocolError, ShmError
from dq.shm.submission_ring import (
    ALLOCATED,
    DONE,
    ENQUEUE_AFTER,
    ENQUEUE_AT,
    ENTRY_OFF,
    FAILED,
    OFF_ASLEEP,
    OFF_TAIL,
    RESULT,
    SLOT,
    SUBMITTED,
    SubmissionRing,
    init_ring,
)
from dq.storage.errors import (
    InvalidArgument,
    InvalidDeadline,
    InvalidQueueName,
    StorageError,
    ValueTooLarge,
    WriteStall,
)
from dq.storage.types import Enqueued, NewItem, check_queue_name

__all__ = ["DrainStats", "SubmissionDrainer"]

log = logging.getLogger(__name__)

_CODES: dict[type[StorageError], int] = {
    ValueTooLarge: 2,
    InvalidQueueName: 5,
    InvalidDeadline: 6,
    InvalidArgument: 1,
}
E_UNAVAILABLE, E_MALFORMED = 3, 4
ERROR_AT = struct.Struct("<H")
BACKSTOP_S = 1.0  # scan for entries written ahead / reap dead producers' slots this often
STALL_RETRY_S = 0.005
STALL_GIVE_UP_S = 30.0


class DrainStats:
    """Counters the drainer keeps (shown by ``dq top`` and the tests)."""

    def __init__(self) -> None:
        self.drained = 0
        self.completed = 0
        self.failed = 0
        self.malformed = 0
        self.reaped = 0
        self.resets = 0


def _code_for(exc: BaseException) -> int:
    for cls, code in _CODES.items():
        if isinstance(exc, cls):
            return code
    return E_UNAVAILABLE


class SubmissionDrainer:
    """One thread that is the ring's only consumer."""

    def __init__(
        self, engine: Any, buf: Any, *, max_batch: int = 1000, idle_s: float = 0.05
    ) -> None:
        self.engine = engine
        self.buf = buf
        self.ring = SubmissionRing(buf)
        self.max_batch = min(max_batch, int(getattr(engine.config, "max_batch", max_batch)))
        self.idle_s = idle_s
        self.stats = DrainStats()
        self._generation = 0
        self._inflight: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._orphans: set[int] = set()
        #: groups waiting out a write stall, per queue in arrival order:
        #: (give up at, slots, items, generation)
        self._parked: dict[str, deque[tuple[float, list[int], list[NewItem], int]]] = {}
        self._thread = threading.Thread(target=self._run, name="dq-submission-drain", daemon=True)

    def start(self) -> SubmissionDrainer:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        with contextlib.suppress(ValueError, OSError):
            A.futex_wake(self.buf, OFF_TAIL, 1)
        self._thread.join(timeout_s)

    # ---- the loop ------------------------------------------------------------------

    def _run(self) -> None:
        next_backstop = time.monotonic() + BACKSTOP_S
        while not self._stop.is_set():
            try:
                backstop = time.monotonic() >= next_backstop
                if backstop:
                    next_backstop = time.monotonic() + BACKSTOP_S
                    self._reap()
                if self._parked:
                    self._retry_parked()
                entries = self._pop_batch(backstop)
                if entries:
                    self._dispatch(entries)
                else:
                    self._sleep(STALL_RETRY_S if self._parked else self.idle_s)
            except ProtocolError as exc:
                self._reset(exc)
            except Exception:  # never let the thread die: log and keep draining
                log.exception("submission drainer error")
                time.sleep(self.idle_s)

    def _pop_batch(self, backstop: bool) -> list[int]:
        pop, out = self.ring.pop, []
        entry = pop(backstop)
        while entry is not None:
            out.append(entry)
            if len(out) >= self.max_batch:
                break
            entry = pop()
        return out

    def _sleep(self, timeout_s: float) -> None:
        buf = self.buf
        tail = A.load_u64(buf, OFF_TAIL)
        A.store_u32(buf, OFF_ASLEEP, 1)
        A.fence()
        if A.load_u64(buf, OFF_TAIL) == tail and self.ring.depth() == 0:
            A.futex_wait(buf, OFF_TAIL, tail & 0xFFFFFFFF, timeout_s)
        A.store_u32(buf, OFF_ASLEEP, 0)

    def _reset(self, exc: ShmError) -> None:
        log.error("submission ring corrupt (%s); re-initializing it", exc)
        with self._lock:
            self._generation += 1
            self._inflight.clear()
        g = self.ring.geo
        init_ring(self.buf, g.capacity, g.payload_size)
        self.ring = SubmissionRing(self.buf)
        self.stats.resets += 1

    # ---- entries -> engine ---------------------------------------------------------

    def _read(self, entry: int) -> tuple[int, str, NewItem] | None:
        """Decode one entry's slot; None (counted) if anything is out of range."""
        ring, buf = self.ring, self.buf
        index = entry & 0xFFFFFFFF
        if index >= ring.capacity:
            self.stats.malformed += 1
            return None
        off = ring.slot_off(index)
        f = SLOT.unpack_from(buf, off)
        state, value_len, stamp, method, qlen = f[0], f[3], f[4], f[5], f[9]
        if state != SUBMITTED:
            self.stats.malformed += 1
            return None
        pay = ring.payload_off(index)
        try:
            if qlen + value_len > ring.geo.payload_size or method not in (
                ENQUEUE_AT,
                ENQUEUE_AFTER,
            ):
                raise ProtocolError("slot fields out of range", slot=index)
            queue = check_queue_name(bytes(buf[pay : pay + qlen]).decode("ascii"))
        except (ProtocolError, StorageError, UnicodeDecodeError):
            self._finish_failed(index, E_MALFORMED, self._generation)
            return None
        value = bytes(buf[pay + qlen : pay + qlen + value_len])
        if method == ENQUEUE_AFTER:
            item = NewItem(value, delay_ms=stamp)
        else:
            item = NewItem(value, deadline=stamp or None)
        return index, queue, item

    def _dispatch(self, entries: Sequence[int]) -> None:
        groups: dict[str, tuple[list[int], list[NewItem]]] = defaultdict(lambda: ([], []))
        for entry in entries:
            got = self._read(entry)
            if got is None:
                continue
            index, queue, item = got
            slots, items = groups[queue]
            slots.append(index)
            items.append(item)
        self.stats.drained += len(entries)
        gen = self._generation
        with self._lock:
            for slots, _ in groups.values():
                self._inflight.update(slots)
        for queue, (slots, items) in groups.items():
            self._submit(queue, slots, items, gen)

    def _submit(self, queue: str, slots: list[int], items: list[NewItem], gen: int) -> None:
        if queue in self._parked:  # behind a stalled group of the same queue: keep order
            self._parked[queue].append((time.monotonic() + STALL_GIVE_UP_S, slots, items, gen))
            return
        if not self._try_submit(queue, slots, items, gen):
            self._parked[queue] = deque([(time.monotonic() + STALL_GIVE_UP_S, slots, items, gen)])

    def _try_submit(self, queue: str, slots: list[int], items: list[NewItem], gen: int) -> bool:
        """Hand a group to the engine; False if the queue is stalled (try again later)."""
        try:
            future = self.engine.enqueue_nowait(queue, items)
        except InvalidArgument as exc:
            if len(items) == 1:
                self._finish_failed(slots[0], _code_for(exc), gen)
                return True
            for slot, item in zip(slots, items, strict=True):  # find the bad one(s)
                self._submit(queue, [slot], [item], gen)
            return True
        except StorageError as exc:
            if isinstance(exc, WriteStall):
                return False  # a segment is being written: the queue takes writes shortly
            for slot in slots:
                self._finish_failed(slot, _code_for(exc), gen)
            return True
        future.add_done_callback(lambda f: self._complete(slots, f, gen))
        return True

    def _retry_parked(self) -> None:
        now = time.monotonic()
        for queue in list(self._parked):
            groups = self._parked[queue]
            while groups:
                give_up, slots, items, gen = groups[0]
                if gen != self._generation:
                    groups.popleft()  # the ring was re-initialized: not ours any more
                    continue
                if now >= give_up:
                    groups.popleft()
                    for slot in slots:
                        self._finish_failed(slot, E_UNAVAILABLE, gen)
                    continue
                if not self._try_submit(queue, slots, items, gen):
                    break
                groups.popleft()
            if not groups:
                del self._parked[queue]

    # ---- completion ------------------------------------------------------------------

    def _complete(self, slots: list[int], future: Future[list[Enqueued]], gen: int) -> None:
        exc = future.exception()
        if exc is not None:
            for slot in slots:
                self._finish_failed(slot, _code_for(exc), gen)
            return
        for slot, done in zip(slots, future.result(), strict=True):
            self._finish(
                slot,
                gen,
                DONE,
                lambda off, d=done: RESULT.pack_into(self.buf, off + 48, d.id, d.deadline),
            )  # type: ignore[misc]
        self.stats.completed += len(slots)

    def _finish_failed(self, slot: int, code: int, gen: int) -> None:
        self.stats.failed += 1
        self._finish(slot, gen, FAILED, lambda off: ERROR_AT.pack_into(self.buf, off + 42, code))

    def _finish(self, slot: int, gen: int, state: int, write: Any) -> None:
        with self._lock:
            if gen != self._generation:
                return  # the ring was re-initialized since: this slot is not ours to touch
            self._inflight.discard(slot)
            buf, off = self.buf, self.ring.slot_off(slot)
            write(off)
            A.store_u32(buf, off, state)
            A.fence()
            if A.load_u32(buf, off + 36):
                A.futex_wake(buf, off, 1)

    # ---- dead producers --------------------------------------------------------------

    def _reap(self) -> None:
        """Free slots whose owner process is gone (it cannot free them itself)."""
        ring, buf = self.ring, self.buf
        referenced: set[int] | None = None
        orphans: set[int] = set()
        freed: set[int] = set()
        for index in range(ring.capacity):
            off = ring.slot_off(index)
            state = A.load_u32(buf, off)
            if state not in (ALLOCATED, SUBMITTED, DONE, FAILED):
                continue
            pid = A.load_u32(buf, off + 32)
            if pid == 0 or _alive(pid):
                continue
            if state == SUBMITTED:
                # In the ring (the drainer will finish it) or in flight: not an orphan yet.
                if referenced is None:
                    referenced = self._referenced()
                with self._lock:
                    busy = index in self._inflight
                if index in referenced or busy:
                    continue
                orphans.add(index)
                if index not in self._orphans:
                    continue  # seen twice in a row before we free it
            self._free(index)
            freed.add(index)
        self._orphans = orphans - freed

    def _referenced(self) -> set[int]:
        ring, buf = self.ring, self.buf
        entries = (A.load_u64(buf, ENTRY_OFF + k * 8) for k in range(ring.capacity))
        return {e & 0xFFFFFFFF for e in entries if e}

    def _free(self, index: int) -> None:
        try:
            self.ring.free(index)
        except ShmError as exc:
            log.warning("cannot reclaim slot %d: %s", index, exc)
            return
        self.stats.reaped += 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
