"""One queue: its log, in-memory segments, segment files, cursor and leases.

The invariant this module keeps: every pending entry whose key is at or below the
cursor (the last dequeued key) is either leased, or cancelled by a tombstone that
has been (or is being) written. So dequeue never looks behind the cursor, and any
new entry is placed strictly after it (its deadline advanced if needed; docs/storage.md:
"deadline can never be before the oldest dequeued item").

Write path (see ``docs/storage.md``): validate → under the queue lock assign ids and
keys, frame one log record for the whole batch → durable per the fsync mode (the
syncer's group commit in ``always``) → only then publish the entries into the
in-memory segment and resolve the caller's future. Until published, a batch's
smallest key is a barrier dequeue does not pass, so the cursor can never overtake an
entry that is not visible yet.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any, Protocol

from dq.storage import fileio
from dq.storage.codec import (
    MAX_DEADLINE,
    MAX_ID,
    PENDING_HEADER,
    TOMBSTONE,
    decode_stats,
    encode_key,
    encode_stats,
    key_deadline,
    key_id,
    tombstone_of,
)
from dq.storage.compactor import Compactor, FreezeResult, freeze_log, merge_segments
from dq.storage.config import EngineConfig
from dq.storage.dedup import enqueue_keyed
from dq.storage.errors import (
    CorruptionError,
    EngineUnavailable,
    InvalidArgument,
    InvalidDeadline,
    QueueDamaged,
    StorageError,
    WriteStall,
)
from dq.storage.futures import settle
from dq.storage.itemmeta import ItemMeta, encode_origin_entry
from dq.storage.leases import Lease, Leases
from dq.storage.memseg import MemSegment
from dq.storage.merge_policy import SegmentDesc
from dq.storage.queue_state import QueueState, load_state
from dq.storage.rates import Rates
from dq.storage.recovery import recover_directory
from dq.storage.segment import SegmentReader, segment_name
from dq.storage.syncer import FsyncStats, Syncer
from dq.storage.types import (
    Delivery,
    Enqueued,
    Extend,
    ItemOutcome,
    ItemStats,
    QueueConfig,
    QueueStats,
    Release,
    Requeue,
)
from dq.storage.view import MergedView
from dq.storage.wal import WalWriter

__all__ = ["PendingBatch", "Queue", "QueueHost", "WriteStall"]

log = logging.getLogger(__name__)

CONFIG_FILE = "queue.json"


def save_config(directory: str, config: QueueConfig) -> None:
    data = json.dumps({"version": 1, **asdict(config)}, sort_keys=True).encode()
    fileio.write_file_atomic(os.path.join(directory, CONFIG_FILE), data)


def load_config(directory: str) -> QueueConfig:
    with open(os.path.join(directory, CONFIG_FILE), "rb") as f:
        raw = json.loads(f.read())
    raw.pop("version", None)
    return QueueConfig(**raw)


class QueueHost(Protocol):
    """What a queue needs from the engine that holds it (and nothing more)."""

    config: EngineConfig
    syncer: Syncer | None
    compactor: Compactor
    fsync_stats: FsyncStats
    now: Callable[[], int]

    def emit(self, kind: str, queue: str, ids: list[int]) -> None: ...

    def merge_policy_hook(self, q: Queue) -> None: ...

    def dead_letter(self, source: Queue, entries: list[tuple[bytes, bytes, bytes]]) -> None: ...


class PendingBatch:
    """One appended record waiting for its sync (``always`` mode): what to publish once
    it is durable, what to undo if it is refused, and whom to answer."""

    __slots__ = ("future", "publish", "result", "rollback", "seq", "wal")

    def __init__(
        self,
        wal: WalWriter,
        seq: int,
        publish: Callable[[], None],
        rollback: Callable[[], None] | None,
        future: Future[Any],
        result: Any,
    ) -> None:
        self.wal = wal
        self.seq = seq
        self.publish = publish
        self.rollback = rollback
        self.future = future
        self.result = result


#: (future, result, error): settled outside the queue lock by ``answer``
Answer = tuple["Future[Any]", Any, BaseException | None]


def answer(answers: list[Answer]) -> None:
    for fut, result, error in answers:
        settle(fut, result, error)


def _backoff(previous: float) -> float:
    """The next retry delay: 50 ms, doubling, at most 5 s."""
    return min(max(previous * 2, 0.05), 5.0)


class Queue:
    def __init__(self, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> None:
        self.engine = engine
        self.name = name
        self.directory = directory
        self.config = config
        self.lock = threading.RLock()
        self.leases = Leases()
        self.view = MergedView()
        self.cursor = b""
        self.segments: list[SegmentReader] = []
        self.frozen: list[tuple[str, MemSegment]] = []
        self.memseg = MemSegment(1)
        self.wal: WalWriter
        #: a log is open and the in-memory state mirrors the directory
        self.loaded = False
        self.next_id = 1
        self.closed = False
        #: why the queue refuses work (an I/O error, or damage found when opening it)
        self.failed: StorageError | None = None
        #: damaged on disk: stays failed until an operator repairs it and restarts
        self.quarantined = False
        self.watchers: list[Callable[[], None]] = []
        self._waiting: list[PendingBatch] = []
        self._unpublished: dict[int, bytes] = {}
        self._token = 0
        self._rotate_requested = False
        self._rotate_delay = 0.0
        self._rotate_retry_at = 0.0
        self._merging = False
        self.merge_error: BaseException | None = None
        self.last_write = time.monotonic()
        # operator features (storage/queue_state.py, itemmeta.py, rates.py)
        self.state = QueueState()
        self.meta = ItemMeta()
        self.rates = Rates()
        self.dead_lettered = 0
        self.lease_expired = 0
        #: bumped whenever the queue is reloaded from disk; older job callbacks are ignored
        self._generation = 0
        self._freeze_delay: dict[str, float] = {}
        self._timers: set[threading.Timer] = set()
        self._recover_delay = 0.0
        self._recover_at = 0.0
        self._log_cut = False
        #: counters shown in ``stats().extra``
        self.counters = {
            "io_errors": 0,
            "freeze_failures": 0,
            "rotation_failures": 0,
            "recoveries": 0,
        }

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> Queue:
        os.makedirs(directory, exist_ok=True)
        save_config(directory, config)
        q = cls(engine, name, directory, config)
        q.wal = WalWriter.create(directory, 1, 1, engine.config.wal_prealloc_bytes)
        q.view.memsegs = [q.memseg]
        q.loaded = True
        fileio.fsync_dir(os.path.dirname(directory))
        return q

    @classmethod
    def open(cls, engine: QueueHost, name: str, directory: str) -> Queue:
        """Open a queue directory. Damage does not raise: the queue is returned
        quarantined (every operation answers ``QueueDamaged`` naming file and offset),
        so one damaged queue never keeps the others from serving."""
        try:
            config = load_config(directory)
            state = load_state(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            q = cls(engine, name, directory, QueueConfig())
            q._quarantine(CorruptionError(f"unreadable queue settings: {exc}", file=directory))
            return q
        q = cls(engine, name, directory, config)
        q.state = state
        try:
            q._load()
        except CorruptionError as exc:
            q._quarantine(exc)
        except Exception as exc:  # a fault (disk full, descriptors): retried, like a restart
            with q.lock:
                answer(q._fail_locked(exc, "opening the queue"))
        return q

    def _load(self) -> None:
        """Read the directory into memory and start a fresh log (the restart path)."""
        rec = recover_directory(self.directory)
        try:
            meta = ItemMeta()
            meta.load_directory(
                self.directory,
                [p for p, _ in rec.frozen],
                self.engine.now(),
                self.config.dedup_window_ms,
            )
            wal = WalWriter.create(
                self.directory,
                rec.next_segment_no,
                max(rec.next_id, self.next_id),
                self.engine.config.wal_prealloc_bytes,
            )
        except BaseException:
            for reader in rec.segments:
                reader.close()
            raise
        self._generation += 1
        self.wal = wal
        self.meta = meta
        self.segments = rec.segments
        self.next_id = max(rec.next_id, self.next_id)  # ids of refused batches stay unused
        self.leases = Leases()
        self.view = MergedView()
        self.cursor = b""
        self._unpublished.clear()
        self._rotate_requested = False
        for reader in self.segments:
            self.view.add_segment(reader, b"")
        self.memseg = MemSegment(rec.next_segment_no)
        self.frozen = rec.frozen
        self.view.memsegs = [self.memseg] + [m for _, m in self.frozen]
        self.loaded = True
        self._log_cut = False
        for path, mem in list(self.frozen):
            self._schedule_freeze(path, mem)

    def _quarantine(self, exc: CorruptionError) -> None:
        file = exc.context.get("file", self.directory)
        offset = exc.context.get("offset")
        self.quarantined = True
        self.failed = QueueDamaged(
            f"queue is damaged at {file} offset {offset}: {exc.message}; "
            "it is kept as it is (see docs/reliability.md)",
            queue=self.name,
            file=file,
            offset=offset,
        )
        log.error(
            "queue %s quarantined: %s (file %s, offset %s); the other queues serve",
            self.name,
            exc.message,
            file,
            offset,
        )

    # ------------------------------------------------------------------ failure

    def _fail_locked(self, exc: BaseException, what: str) -> list[Answer]:
        """Fail the queue after a write or sync error (call under the lock).

        After a failed write or fsync the page cache cannot be trusted to say what is
        on disk, so nothing more is acknowledged: every waiting batch is refused and
        rolled back, records still buffered are discarded (a refused operation must
        never happen later), and the queue refuses work until it is reopened from disk.
        """
        error: BaseException = (
            exc
            if isinstance(exc, StorageError)
            else EngineUnavailable(f"{what} failed: {exc}", queue=self.name)
        )
        if self.failed is None:
            self.counters["io_errors"] += 1
            self.failed = EngineUnavailable(
                f"queue failed: {what}: {exc}; it is reopened from disk once the fault clears",
                queue=self.name,
            )
            self.failed.__cause__ = exc
            self._recover_delay = 0.0
            self._recover_at = time.monotonic()
            log.error(
                "queue %s: %s failed: %s; the queue refuses work until reopened",
                self.name,
                what,
                exc,
            )
        if self.loaded:
            self.wal.discard_buffer()
            try:  # before anyone hears "refused": a crash now must not bring it back
                self._cut_log_locked()
            except Exception as cut_exc:  # tried again when the queue reopens
                log.error("queue %s: cutting the log back failed: %s", self.name, cut_exc)
        answers: list[Answer] = []
        for batch in reversed(self._waiting):
            if batch.rollback is not None:
                batch.rollback()
            answers.append((batch.future, None, error))
        self._waiting = []
        return answers

    def _cut_log_locked(self) -> None:
        """Cut the log back to exactly what was acknowledged — synced bytes in
        ``always``, written bytes otherwise; what lies beyond belongs to refused
        batches — and sync it. Once per failure."""
        if self._log_cut:
            return
        wal = self.wal
        keep = wal.synced_offset if self.engine.config.fsync == "always" else wal.offset
        wal.cut_back(keep)
        self._log_cut = True

    def recover_if_due(self) -> None:
        """Reopen a failed queue from disk when its retry is due (the restart path)."""
        with self.lock:
            self._recover_locked()

    def _recover_locked(self) -> None:
        if self.failed is None or self.quarantined or self.closed:
            return
        if time.monotonic() < self._recover_at or self._merging:
            return
        try:
            if self.loaded:
                self._cut_log_locked()
            for reader in self.segments:
                reader.close()
            self.segments = []
            self.loaded = False
            self._load()
        except CorruptionError as exc:
            self._quarantine(exc)
            return
        except Exception as exc:
            self._recover_delay = _backoff(self._recover_delay)
            self._recover_at = time.monotonic() + self._recover_delay
            log.warning(
                "queue %s: still failed; reopening from disk failed (%s), next try in %.2f s",
                self.name,
                exc,
                self._recover_delay,
            )
            return
        log.warning("queue %s: reopened from disk after: %s", self.name, self.failed)
        self.failed = None
        self.counters["recoveries"] += 1

    # ------------------------------------------------------------------ helpers

    def _check_open(self) -> None:
        if self.failed is not None:
            self._recover_locked()
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise EngineUnavailable("queue is closed", queue=self.name)

    def _place(self, deadline: int, item_id: int) -> tuple[int, bytes]:
        """Key for (deadline, id), deadline advanced so the key sorts after the cursor."""
        key = encode_key(deadline, item_id)
        cursor = self.cursor
        if key <= cursor:
            cd = key_deadline(cursor)
            deadline = cd if item_id > key_id(cursor) else cd + 1
            key = encode_key(deadline, item_id)
        return deadline, key

    def _hold(self, key: bytes) -> int:
        self._token += 1
        self._unpublished[self._token] = key
        return self._token

    def _submit(
        self,
        payload: bytes,
        publish: Callable[[], None],
        result: Any,
        rollback: Callable[[], None] | None = None,
        meta: bytes = b"",
    ) -> Future[Any]:
        """Append one record; resolve with ``result`` once durable per the fsync mode."""
        fut: Future[Any] = Future()
        wal = self.wal
        seq = wal.append(payload, meta)
        self.last_write = time.monotonic()
        mode = self.engine.config.fsync
        answers: list[Answer] = []
        if mode == "always":
            self._waiting.append(PendingBatch(wal, seq, publish, rollback, fut, result))
            assert self.engine.syncer is not None
            self.engine.syncer.mark_dirty(self)
        else:
            data, _seq = wal.take_buffer()
            try:
                with wal.io_lock:
                    wal.write(data)
            except BaseException as exc:
                if rollback is not None:
                    rollback()
                answer(self._fail_locked(exc, "writing the log"))
                if isinstance(exc, StorageError):
                    raise
                assert self.failed is not None
                raise self.failed from exc
            publish()
            settle(fut, result)
            if mode == "interval" and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        if self.fill() >= self.engine.config.memseg_bytes:
            answers = self._request_rotation()
        answer(answers)
        return fut

    def _complete(self, wal: WalWriter, seq: int) -> list[Answer]:
        """Publish every waiting batch of ``wal`` up to ``seq``; return the answers."""
        done: list[Answer] = []
        keep: list[PendingBatch] = []
        for batch in self._waiting:
            if batch.wal is wal and batch.seq <= seq:
                batch.publish()
                done.append((batch.future, batch.result, None))
            else:
                keep.append(batch)
        self._waiting = keep
        return done

    def _notify(self) -> None:
        for cb in list(self.watchers):
            try:
                cb()
            except Exception:
                log.exception("queue watcher failed")

    # ------------------------------------------------------------------ group commit

    def sync_round(self) -> None:
        """Called by the syncer: write and sync what is buffered, then publish it.

        The log's ``io_lock`` is taken before the queue lock is let go, so no one can
        close the log between taking its buffer and writing it. Any write or sync error
        fails the queue, in every mode (``_fail_locked``).
        """
        mode = self.engine.config.fsync
        with self.lock:
            if not self.loaded or self.failed is not None or self.closed:
                return
            wal = self.wal
            data, seq = wal.take_buffer()
            wal.io_lock.acquire()
        error: BaseException | None = None
        try:
            wal.write(data)
            if mode != "never":
                t0 = time.perf_counter()
                wal.sync()
                self.engine.fsync_stats.observe(time.perf_counter() - t0)
        except BaseException as exc:
            error = exc
        finally:
            wal.io_lock.release()
        with self.lock:
            if error is not None:
                answers = self._fail_locked(error, "syncing the log")
            elif mode == "always":
                answers = self._complete(wal, seq)
                if self._rotate_requested and not self.closed and self.failed is None:
                    answers += self._rotate_locked()
            else:
                answers = []
            if any(e is None for _f, _r, e in answers):
                self._notify()
        answer(answers)

    # ------------------------------------------------------------------ rotation

    def _request_rotation(self) -> list[Answer]:
        if self.engine.config.fsync == "always":
            self._rotate_requested = True
            return []
        return self._rotate_locked()

    def fill(self) -> int:
        """How full the current log is, in bytes: its size, or the memory its in-memory
        segment takes if that is more (small values cost far more in memory than in the
        log), so ``memseg_bytes`` bounds both."""
        return max(self.wal.size, self.memseg.bytes)

    def stalled(self) -> bool:
        """Writes wait: the log is twice over its limit while segment files are written."""
        return self.fill() > 2 * self.engine.config.memseg_bytes

    def _retry_rotation(self) -> None:
        """Writes are stalled: try the pending rotation again (when its backoff allows)."""
        if not self._rotate_requested:
            return
        if self.engine.config.fsync == "always":
            assert self.engine.syncer is not None
            self.engine.syncer.mark_dirty(self)
        else:
            answer(self._rotate_locked())

    def _rotate_locked(self) -> list[Answer]:
        """Start the next log and freeze the current one: all or nothing.

        The next log is created first. If that fails the queue stays on its current
        log, still writable, and the rotation is retried with a backoff. Then the
        current log is closed (its buffer written and synced): if that fails, the queue
        fails like any failed sync, and every waiter is answered.
        """
        self._rotate_requested = True
        if len(self.frozen) >= self.engine.config.max_frozen:
            return []  # retried when a freeze is installed
        if time.monotonic() < self._rotate_retry_at:
            return []
        old = self.wal
        no = old.segment_no + 1
        try:
            new = WalWriter.create(
                self.directory, no, self.next_id, self.engine.config.wal_prealloc_bytes
            )
        except Exception as exc:
            self.counters["rotation_failures"] += 1
            self._rotate_delay = _backoff(self._rotate_delay)
            self._rotate_retry_at = time.monotonic() + self._rotate_delay
            log.warning(
                "queue %s: could not start log %d (%s); staying on log %d, next try in %.2f s",
                self.name,
                no,
                exc,
                old.segment_no,
                self._rotate_delay,
            )
            return []
        self._rotate_requested = False
        self._rotate_delay = 0.0
        try:
            old.close(sync=self.engine.config.fsync != "never")
        except Exception as exc:
            new.abandon()
            fileio.remove(new.path)
            return self._fail_locked(exc, "closing the log for rotation")
        answers = self._complete(old, old.appended_seq)
        ro = old.path + "_ro"
        try:
            fileio.rename(old.path, ro)
        except OSError as exc:  # recovery reads a closed ``.log`` the same way
            log.warning(
                "queue %s: could not rename %s (%s); freezing it as is", self.name, old.path, exc
            )
            ro = old.path
        self.wal = new
        frozen = self.memseg
        self.memseg = MemSegment(no)
        self.frozen.append((ro, frozen))
        self.view.memsegs = [self.memseg] + [m for _, m in self.frozen]
        self._schedule_freeze(ro, frozen)
        return answers

    # ------------------------------------------------------------------ freezing

    def _schedule_freeze(self, path: str, mem: MemSegment) -> None:
        gen = self._generation
        fut = self.engine.compactor.submit(freeze_log, path, self.directory)
        fut.add_done_callback(lambda f: self._install_frozen(path, mem, f, gen))

    def _install_frozen(self, path: str, mem: MemSegment, fut: Future[Any], gen: int) -> None:
        """Swap a finished segment file in for its frozen in-memory segment.

        The ``.log_ro`` is deleted (and the deletion synced) *before* the segment joins
        the set merges may read: so a merge output never covers a log that still exists.
        Any failure here, or in the freeze itself, is retried (``_freeze_failed``).
        """
        answers: list[Answer] = []
        try:
            result: FreezeResult = fut.result()
            with self.lock:
                if self.closed or gen != self._generation:
                    return
                reader = SegmentReader(result.path) if result.path else None
                try:
                    fileio.remove(path)
                    fileio.fsync_dir(self.directory)
                except BaseException:
                    if reader is not None:
                        reader.close()
                    raise
                self._freeze_delay.pop(path, None)
                self.frozen = [(p, m) for p, m in self.frozen if m is not mem]
                self.view.memsegs = [self.memseg] + [m for _, m in self.frozen]
                if reader is not None:
                    self.segments.append(reader)
                    self.segments.sort(key=lambda r: r.seg_lo)
                    self.view.add_segment(reader, self.cursor)
                mem.replaced_by = reader
                if self._rotate_requested and self.failed is None:
                    if self.engine.config.fsync == "always":
                        assert self.engine.syncer is not None
                        self.engine.syncer.mark_dirty(self)
                    else:
                        answers = self._rotate_locked()
        except Exception as exc:
            self._freeze_failed(path, mem, exc, gen)
            return
        answer(answers)
        self.engine.merge_policy_hook(self)

    def _freeze_failed(self, path: str, mem: MemSegment, exc: BaseException, gen: int) -> None:
        """Retry a failed freeze (disk full, descriptors, a killed worker) with a backoff,
        until it succeeds: the log stays in memory and on disk meanwhile."""
        with self.lock:
            if self.closed or gen != self._generation:
                return
            self.counters["freeze_failures"] += 1
            delay = _backoff(self._freeze_delay.get(path, 0.0))
            self._freeze_delay[path] = delay
            log.error(
                "queue %s: freezing %s failed (%s); retrying in %.2f s", self.name, path, exc, delay
            )
            self.merge_error = exc
            timer = threading.Timer(delay, self._retry_freeze, (path, mem, gen))
            timer.daemon = True
            self._timers.add(timer)
            timer.start()

    def _retry_freeze(self, path: str, mem: MemSegment, gen: int) -> None:
        with self.lock:
            self._timers = {
                t for t in self._timers if t.is_alive() and t is not threading.current_thread()
            }
            if self.closed or gen != self._generation or all(m is not mem for _, m in self.frozen):
                return
        if os.path.exists(path):
            self._schedule_freeze(path, mem)
            return
        # the log is gone: an earlier attempt wrote the segment and deleted the log, then
        # failed to sync the directory; install what is there
        no = mem.segment_no
        seg = os.path.join(self.directory, segment_name(no, no))
        done: Future[Any] = Future()
        done.set_result(FreezeResult(no, seg if os.path.exists(seg) else None))
        self._install_frozen(path, mem, done, gen)

    def freeze_now(self, timeout: float = 30.0) -> None:
        """Rotate the log now (``Engine.freeze``); waits until the rotation is done."""
        with self.lock:
            self._check_open()
            answers = self._request_rotation()
        answer(answers)
        syncer = self.engine.syncer
        if self.engine.config.fsync != "always" or syncer is None:
            return
        syncer.mark_dirty(self)
        deadline = time.monotonic() + timeout
        while self._rotate_requested and time.monotonic() < deadline:
            time.sleep(0.001)

    def unfrozen_logs(self) -> list[int]:
        """Numbers of logs that have no segment file yet."""
        with self.lock:
            return [m.segment_no for _, m in self.frozen] + [self.memseg.segment_no]

    def segment_descriptions(self) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        with self.lock:
            return [
                SegmentDesc(
                    r.seg_lo, r.seg_hi, r.info.pending_count, r.info.tombstone_count, r.file_size
                )
                for r in self.segments
            ]

    def merge_idle(self) -> bool:
        """True when a merge could start now (open, healthy, no merge running)."""
        with self.lock:
            return self.loaded and not (self.closed or self._merging or self.failed is not None)

    def freeze_if_idle(self, idle_seconds: float) -> None:
        """Freeze a log holding tombstones after a quiet spell, so merges can use them."""
        answers: list[Answer] = []
        with self.lock:
            if not self.loaded or self.closed or self.failed is not None:
                return
            if self.frozen or self._rotate_requested:
                return
            if self.memseg.tombstone_count == 0:
                return
            if time.monotonic() - self.last_write < idle_seconds:
                return
            answers = self._request_rotation()
            if self._rotate_requested and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        answer(answers)

    # ------------------------------------------------------------------ merging

    def merge(self, start: int, stop: int, *, wait: bool = True) -> Future[Any] | None:
        """Merge ``segments[start:stop]`` (a contiguous range) into one segment file.

        Tombstones whose pending entry is outside the range are kept (rogue), unless
        the range starts at the oldest segment and no older log is waiting for its
        segment file, where nothing older could need them. A range whose log numbers
        span a log that has no segment file yet is refused: the output's name would
        claim that log, and recovery would take the claim for a fact.
        """
        with self.lock:
            self._check_open()
            if self._merging:
                raise InvalidArgument("a merge is already running", queue=self.name)
            inputs = self.segments[start:stop]
            if len(inputs) < 1:
                return None
            lo = min(r.seg_lo for r in inputs)
            hi = max(r.seg_hi for r in inputs)
            unfrozen = self.unfrozen_logs()
            spanned = [n for n in unfrozen if lo <= n <= hi]
            if spanned:
                raise InvalidArgument(
                    f"segments {lo}..{hi} span log {spanned[0]}, which has no segment file yet",
                    queue=self.name,
                )
            self._merging = True
            drop_rogue = start == 0 and all(n > hi for n in unfrozen)
            marker = os.path.join(self.directory, "merge.cancel")
        fut = self.engine.compactor.submit(
            merge_segments,
            [r.path for r in inputs],
            self.directory,
            drop_rogue=drop_rogue,
            cancel_marker=marker,
        )
        fut.add_done_callback(lambda f: self._install_merge(inputs, f))
        if wait:
            fut.result()
        return fut

    def _install_merge(self, inputs: list[SegmentReader], fut: Future[Any]) -> None:
        try:
            path: str | None = fut.result()
        except BaseException as exc:
            with self.lock:
                self._merging = False
            if not self.closed:
                log.error("queue %s: merge failed: %s", self.name, exc)
                self.merge_error = exc
            return
        with self.lock:
            self._merging = False
            if self.closed:
                return
            reader = SegmentReader(path) if path else None
            self.view.remove_segments(inputs)
            gone = {id(r) for r in inputs}
            self.segments = [r for r in self.segments if id(r) not in gone]
            if reader is not None:
                self.segments.append(reader)
                self.segments.sort(key=lambda r: r.seg_lo)
                self.view.add_segment(reader, self.cursor)
            for r in inputs:
                r.replaced_by = reader
                if r.path != path:
                    fileio.remove(r.path)
                r.close()
            fileio.fsync_dir(self.directory)
        self.engine.merge_policy_hook(self)

    # ------------------------------------------------------------------ writes

    def enqueue(
        self,
        prepared: Sequence[tuple[int, bytes]],
        stats: tuple[int, int, int] | None = None,
        keys: Sequence[str | None] | None = None,
        origin: str | None = None,
    ) -> Future[list[Enqueued]]:
        """Enqueue (deadline, value) pairs, already validated. ``stats`` for dead letters
        and redrives; ``keys`` (idempotency) and ``origin`` (the queue a dead letter came
        from) travel in the same log record as the items (``storage/itemmeta.py``)."""
        now = self.engine.now()
        st = encode_stats(*stats) if stats is not None else encode_stats(now, 0, 0)
        pack = PENDING_HEADER.pack
        with self.lock:
            self._check_open()
            if self.stalled():
                self._retry_rotation()
                raise WriteStall("writes are stalled while segment files are written; retry")
            window = self.config.dedup_window_ms
            if keys is not None and window > 0 and any(k is not None for k in keys):
                return enqueue_keyed(self, prepared, st, keys, now, window)
            first = self.next_id
            self.next_id += len(prepared)
            parts: list[bytes] = []
            keyed: list[tuple[bytes, bytes]] = []
            results: list[Enqueued] = []
            meta: list[bytes] = []
            for i, (deadline, value) in enumerate(prepared):
                deadline, key = self._place(deadline, first + i)
                parts.append(pack(key, st, len(value)))
                parts.append(value)
                keyed.append((key, value))
                results.append(Enqueued(first + i, deadline))
                if origin is not None:
                    meta.append(encode_origin_entry(first + i, origin))
                    self.meta.origins[first + i] = origin
            self.rates.add("enqueue", len(prepared), now)
            token = self._hold(min(k for k, _ in keyed))
            mem = self.memseg

            def publish() -> None:
                add = mem.add
                for key, value in keyed:
                    add(key, st, value)
                del self._unpublished[token]
                self._notify()

            def rollback() -> None:
                self._unpublished.pop(token, None)

            fut = self._submit(b"".join(parts), publish, results, rollback, b"".join(meta))
        self.engine.emit("enqueued", self.name, [r.id for r in results])
        return fut

    def _requeue_locked(
        self, moves: list[tuple[int, Lease, int]], now: int, outcomes: list[ItemOutcome]
    ) -> tuple[bytes, list[tuple[bytes, bytes, bytes]], list[bytes]] | None:
        """Build a record moving leased items to new deadlines (pending + tombstone)."""
        parts: list[bytes] = []
        pend: list[tuple[bytes, bytes, bytes]] = []
        tombs: list[bytes] = []
        pack = PENDING_HEADER.pack
        for item_id, lease, deadline in moves:
            found = self._lookup(lease.key, lease.source)
            if found is None:
                log.error("queue %s: value of item %d not found; left pending", self.name, item_id)
                continue
            deadline, key = self._place(deadline, item_id)
            st = encode_stats(lease.enqueue_time, now, lease.dequeue_count)
            value = found[1]
            parts.append(pack(key, st, len(value)))
            parts.append(value)
            tomb = tombstone_of(lease.key)
            parts.append(tomb)
            pend.append((key, st, value))
            tombs.append(tomb)
            outcomes.append(ItemOutcome(item_id, deadline=deadline))
        if not parts:
            return None
        return b"".join(parts), pend, tombs

    def _write_moves(
        self,
        built: tuple[bytes, list[tuple[bytes, bytes, bytes]], list[bytes]],
        result: Any,
        rollback: Callable[[], None] | None,
    ) -> Future[Any]:
        payload, pend, tombs = built
        token = self._hold(min(k for k, _, _ in pend))
        mem = self.memseg

        def publish() -> None:
            for key, st, value in pend:
                mem.add(key, st, value)
            for t in tombs:
                mem.add_tombstone_behind(t)
            del self._unpublished[token]
            self._notify()

        def undo() -> None:
            self._unpublished.pop(token, None)
            if rollback is not None:
                rollback()

        return self._submit(payload, publish, result, undo)

    def _restore(self, taken: list[tuple[int, Lease]]) -> Callable[[], None]:
        def rollback() -> None:
            for item_id, lease in taken:
                if item_id not in self.leases:
                    self.leases.add(
                        item_id,
                        lease.key,
                        (lease.enqueue_time, lease.requeue_time, lease.dequeue_count),
                        lease.expires,
                        lease.source,
                        lease.since,
                    )

        return rollback

    def release(self, items: Sequence[Release]) -> Future[list[ItemOutcome]]:
        now = self.engine.now()
        outcomes: list[ItemOutcome] = []
        with self.lock:
            self._check_open()
            taken: list[tuple[int, Lease]] = []
            for r in items:
                try:
                    lease = self.leases.check(r.id, r.receipt, self.next_id, now)
                except StorageError as exc:
                    outcomes.append(ItemOutcome(r.id, exc.code, exc.message))
                    continue
                self.leases.pop(r.id)
                taken.append((r.id, lease))
                outcomes.append(ItemOutcome(r.id))
            if not taken:
                done: Future[list[ItemOutcome]] = Future()
                done.set_result(outcomes)
                return done
            keys = [lease.key for _, lease in taken]
            self.rates.add("release", len(taken), now)
            fut = self.tombstone_keys(keys, outcomes, self._restore(taken))
        self.engine.emit("released", self.name, [i for i, _ in taken])
        return fut

    def requeue(self, items: Sequence[Requeue]) -> Future[list[ItemOutcome]]:
        now = self.engine.now()
        results: dict[int, ItemOutcome] = {}
        order: list[int] = []
        with self.lock:
            self._check_open()
            moves: list[tuple[int, Lease, int]] = []
            taken: list[tuple[int, Lease]] = []
            for r in items:
                order.append(r.id)
                try:
                    deadline = resolve_deadline(r.deadline, r.delay_ms, now)
                    lease = self.leases.check(r.id, r.receipt, self.next_id, now)
                except StorageError as exc:
                    results[r.id] = ItemOutcome(r.id, exc.code, exc.message)
                    continue
                self.leases.pop(r.id)
                taken.append((r.id, lease))
                moves.append((r.id, lease, deadline))
            moved: list[ItemOutcome] = []
            built = self._requeue_locked(moves, now, moved)
            for o in moved:
                results[o.id] = o
            outcomes = [
                results.get(i, ItemOutcome(i, "item_not_found", "value not found")) for i in order
            ]
            if built is None:
                done: Future[list[ItemOutcome]] = Future()
                done.set_result(outcomes)
                return done
            fut = self._write_moves(built, outcomes, self._restore(taken))
        self.engine.emit("requeued", self.name, [o.id for o in moved])
        return fut

    def extend(self, items: Sequence[Extend]) -> list[ItemOutcome]:
        now = self.engine.now()
        out: list[ItemOutcome] = []
        with self.lock:
            self._check_open()
            for e in items:
                try:
                    check_lease_ms(e.lease_ms)
                    lease = self.leases.check(e.id, e.receipt, self.next_id, now)
                except StorageError as exc:
                    out.append(ItemOutcome(e.id, exc.code, exc.message))
                    continue
                self.leases.extend(e.id, lease, now + e.lease_ms)
                out.append(
                    ItemOutcome(
                        e.id,
                        receipt=self.leases.receipt(e.id, lease),
                        lease_expires=now + e.lease_ms,
                    )
                )
        return out

    def expire_leases(self) -> int:
        now = self.engine.now()
        with self.lock:
            if self.closed or self.failed is not None:
                return 0
            n = self._expire_locked(now)
        return n

    def _expire_locked(self, now: int) -> int:
        expired = self.leases.pop_expired(now)
        if not expired:
            return 0
        self.lease_expired += len(expired)
        moved: list[ItemOutcome] = []
        built = self._requeue_locked([(i, lease, now) for i, lease in expired], now, moved)
        if built is not None:
            self._write_moves(built, moved, None)
            self.engine.emit("lease_expired", self.name, [o.id for o in moved])
        return len(expired)

    # ------------------------------------------------------------------ reads

    def _lookup(self, key: bytes, hint: object | None) -> tuple[bytes, bytes] | None:
        """(stats, value) of the pending entry ``key`` wherever it lives now."""
        for mem in (self.memseg, *(m for _, m in self.frozen)):
            found = mem.entries.get(key)
            if found is not None:
                return found
        src = hint
        while src is not None and getattr(src, "replaced_by", None) is not None:
            src = src.replaced_by  # type: ignore[attr-defined]
        if isinstance(src, SegmentReader) and not src.closed:
            hit = src.get(key)
            if hit is not None:
                return hit
        for reader in reversed(self.segments):
            if reader.first_keys and reader.first_keys[0] <= key <= reader.info.last_key:
                hit = reader.get(key)
                if hit is not None:
                    return hit
        return None

    def dequeue(self, count: int, lease_ms: int | None) -> list[Delivery]:
        now = self.engine.now()
        lease_ms = self.config.default_lease_ms if lease_ms is None else lease_ms
        check_lease_ms(lease_ms)
        out: list[Delivery] = []
        dead: list[tuple[bytes, bytes, bytes]] = []
        with self.lock:
            self._check_open()
            self._expire_locked(now)
            if self.state.paused:
                return out  # a paused queue hands out nothing; lease expiry still runs
            limit = encode_key(now, MAX_ID, TOMBSTONE)
            barrier = min(self._unpublished.values()) if self._unpublished else None
            max_deliveries = self.config.max_deliveries
            expires = now + lease_ms
            view, leases = self.view, self.leases
            after = self.cursor
            while len(out) < count:
                after, hit = view.next_live(after, limit, barrier)
                if hit is None:
                    break
                key, stats, value, source = hit
                enq, req, cnt = decode_stats(stats)
                item_id = key_id(key)
                if max_deliveries is not None and cnt >= max_deliveries:
                    dead.append((key, stats, value))
                    continue
                receipt = leases.add(item_id, key, (enq, req, cnt + 1), expires, source, now)
                out.append(
                    Delivery(
                        item_id,
                        receipt,
                        value,
                        key_deadline(key),
                        ItemStats(enq, req, cnt + 1),
                        expires,
                    )
                )
            self.cursor = after
            if out:
                self.rates.add("dequeue", len(out), now)
        if dead:
            self.engine.dead_letter(self, dead)
        return out

    def tombstone_keys(
        self,
        keys: list[bytes],
        result: Any = None,
        rollback: Callable[[], None] | None = None,
    ) -> Future[Any]:
        """Cancel delivered pending entries (a release, or a move to a dead-letter queue)."""
        with self.lock:
            self._check_open()
            tombs = [tombstone_of(k) for k in keys]
            mem = self.memseg

            def publish() -> None:
                for t in tombs:
                    mem.add_tombstone_behind(t)

            return self._submit(b"".join(tombs), publish, result, rollback)

    def next_wakeup(self) -> int | None:
        with self.lock:
            top = None if self.state.paused else self.view.peek(self.cursor)
            times = [key_deadline(top[0])] if top is not None else []
            exp = self.leases.next_expiry()
            if exp is not None:
                times.append(exp)
            return min(times) if times else None

    def stats(self) -> QueueStats:
        now = self.engine.now()
        with self.lock:
            nowkey = encode_key(now, MAX_ID, TOMBSTONE)
            mems = [self.memseg, *(m for _, m in self.frozen)]
            pending = sum(m.pending_count - m.tombstone_count for m in mems)
            pending += sum(r.info.pending_count - r.info.tombstone_count for r in self.segments)
            due = sum(m.count_between(self.cursor, nowkey) for m in mems)
            for r in self.segments:
                due += estimate_between(r, self.cursor, nowkey)
            leased = len(self.leases)
            due = max(0, min(due, pending - leased))
            top = self.view.peek(self.cursor)  # may be a cancelled pair: only if work is due
            oldest = None
            if due > 0 and top is not None and key_deadline(top[0]) <= now:
                oldest = now - key_deadline(top[0])
            disk = sum(r.file_size for r in self.segments)
            disk += self.wal.size if self.loaded else 0
            for path, _m in self.frozen:
                try:
                    disk += os.path.getsize(path)
                except OSError:
                    pass
            return QueueStats(
                name=self.name,
                config=self.config,
                pending=max(pending, 0),
                due=due,
                delayed=max(pending - leased - due, 0),
                leased=leased,
                segments=len(self.segments),
                bytes_on_disk=disk,
                oldest_due_age_ms=oldest,
                next_id=self.next_id,
                extra={
                    "frozen": len(self.frozen),
                    "memseg_entries": len(self.memseg),
                    "memory_bytes": sum(m.bytes for m in mems),
                    "failed": int(self.failed is not None),
                    "damaged": int(self.quarantined),
                    **self.counters,
                },
            )

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            marker = os.path.join(self.directory, "merge.cancel")
            if self._merging:
                with open(marker, "wb"):
                    pass
        self.engine.compactor.wait_idle(timeout=120)
        answers: list[Answer] = []
        with self.lock:
            self.closed = True
            for timer in self._timers:
                timer.cancel()
            if self.loaded and self.failed is None:
                try:
                    self.wal.close(sync=self.engine.config.fsync != "never")
                    answers = self._complete(self.wal, self.wal.appended_seq)
                except Exception as exc:
                    answers = self._fail_locked(exc, "closing the log")
            elif self.loaded:
                self.wal.abandon()
            gone = EngineUnavailable("queue is closed", queue=self.name)
            answers += [(b.future, None, gone) for b in self._waiting]  # none in practice
            self._waiting = []
            for r in self.segments:
                r.close()
            fileio.remove(marker)
        answer(answers)


def estimate_between(reader: SegmentReader, after: bytes, upto: bytes) -> int:
    """Entries of ``reader`` with after < key <= upto, to within one block at each end.

    Exactly 0 when ``after`` is at or past the segment's last key (a segment whose
    items were all delivered: its last block would otherwise count as due).
    """
    if not reader.first_keys or upto < reader.first_keys[0] or after >= reader.info.last_key:
        return 0
    lo = reader.block_for(after) if after else 0
    hi = reader.block_for(upto)
    return sum(reader.block_entries[lo : hi + 1])


def resolve_deadline(deadline: int | None, delay_ms: int | None, now: int) -> int:
    """The absolute deadline for a write; validates the 48-bit range."""
    if deadline is not None and delay_ms is not None:
        raise InvalidArgument("give either deadline or delay_ms, not both")
    if deadline is None:
        if delay_ms is not None and (not isinstance(delay_ms, int) or delay_ms < 0):
            raise InvalidArgument("delay_ms must be a non-negative integer", delay_ms=delay_ms)
        deadline = now + (delay_ms or 0)
    if (
        not isinstance(deadline, int)
        or isinstance(deadline, bool)
        or not 0 <= deadline <= MAX_DEADLINE
    ):
        raise InvalidDeadline(
            "deadline must be ms since the epoch within 48 bits", deadline=deadline
        )
    return deadline


MAX_LEASE_MS = 12 * 3600 * 1000


def check_lease_ms(lease_ms: int) -> None:
    if (
        not isinstance(lease_ms, int)
        or isinstance(lease_ms, bool)
        or not 1 <= lease_ms <= MAX_LEASE_MS
    ):
        raise InvalidArgument(f"lease_ms must be between 1 and {MAX_LEASE_MS}", lease_ms=lease_ms)
