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

``Queue`` is assembled from one module per job; each keeps its part of the invariant:

- ``queue_core.py``: the fields (guarded by ``lock``) and ``QueueHost``, what the
  queue needs from its engine;
- ``health.py``: ``Health``, the part that says why the queue refuses work (an I/O
  error, damage) and when it next tries to reopen (``health``);
- ``group_commit.py``: ``GroupCommit``, the part that owns the log, the batches waiting
  to be durable and the barrier of unpublished ones (``commit``);
- ``segment_set.py``: ``SegmentSet``, the part that owns the in-memory segments, the
  segment files and the merged view, and the state of rotations, freezes and merges
  (``files``);
- ``queue_items.py``: release, requeue, extend, lease expiry, tombstones;
- ``queue_reads.py``: dequeue, next wake-up, stats;
- ``queue_replica.py``: a replica group's follower applying records, copies for followers;
- ``queue_config.py`` (``queue.json``) and ``validation.py`` (deadlines, leases).

This module opens, loads and closes a queue, places keys after the cursor, runs the
write path (enqueue, with ``dedup.py`` sorting out idempotency keys; appending a batch,
``_submit``; the sync round; publishing what is durable, ``_publish``), and the jobs
that span parts: rotating the log, freezing and merging, failing and reopening.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from dq.storage import fileio
from dq.storage.codec import PENDING_HEADER, encode_key, encode_stats, key_deadline, key_id
from dq.storage.compactor import CompactionCancelled, FreezeResult, freeze_log, merge_segments
from dq.storage.dedup import KeyedBatch, split_keyed
from dq.storage.errors import (
    CorruptionError,
    EngineUnavailable,
    ReplicationStalled,
    ReplicationTimeout,
    StorageError,
    WriteStall,
)
from dq.storage.futures import Answer, answer, settle
from dq.storage.group_commit import PendingBatch
from dq.storage.itemmeta import ItemMeta, encode_origin_entry
from dq.storage.leases import Leases
from dq.storage.memseg import MemSegment
from dq.storage.merge_policy import SegmentDesc
from dq.storage.queue_config import CONFIG_FILE, load_config, save_config
from dq.storage.queue_core import QueueHost
from dq.storage.queue_items import ItemsMixin
from dq.storage.queue_reads import ReadsMixin
from dq.storage.queue_replica import ReplicaMixin
from dq.storage.queue_state import STATE_FILE, QueueState, load_state, save_state
from dq.storage.recovery import recover_directory
from dq.storage.segment import SegmentReader
from dq.storage.types import Enqueued, QueueConfig
from dq.storage.wal import WalWriter

__all__ = ["Queue", "QueueHost"]

log = logging.getLogger("dq.storage.queue")


class Queue(ItemsMixin, ReadsMixin, ReplicaMixin):
    """One queue. Its state is declared in ``QueueCore``; its jobs are mixed in from the
    modules named above, whose methods all run with ``self`` a ``Queue``."""

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> Queue:
        os.makedirs(directory, exist_ok=True)
        save_config(directory, config)
        q = cls(engine, name, directory, config)
        q.commit.start(WalWriter.create(directory, 1, 1, engine.config.wal_prealloc_bytes))
        q.loaded = True
        fileio.fsync_dir(os.path.dirname(directory))
        return q

    @classmethod
    def open(cls, engine: QueueHost, name: str, directory: str) -> Queue:
        """Open a queue directory. Damage does not raise: the queue is returned
        quarantined (every operation answers ``QueueDamaged`` naming file and offset),
        so one damaged queue never keeps the others from serving."""
        settings = CONFIG_FILE
        try:
            config = load_config(directory)
            settings = STATE_FILE
            state = load_state(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # name the file that could not be read (the operator rewrites or removes
            # it), and where in it the JSON broke off
            q = cls(engine, name, directory, QueueConfig())
            q.health.quarantine(
                CorruptionError(
                    f"unreadable {settings}: {exc}",
                    file=os.path.join(directory, settings),
                    offset=getattr(exc, "pos", 0),
                )
            )
            return q
        q = cls(engine, name, directory, config)
        q.state = state
        try:
            q._load()
        except CorruptionError as exc:
            q.health.quarantine(exc)
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
        self.commit.start(wal)
        self.files.load(rec)
        self.meta = meta
        self.next_id = max(rec.next_id, self.next_id)  # ids of refused batches stay unused
        self.leases = Leases()
        self.cursor = b""
        self.loaded = True
        for path, mem in list(self.files.frozen):
            self._schedule_freeze(path, mem)

    def _place(self, deadline: int, item_id: int) -> tuple[int, bytes]:
        """Key for (deadline, id), deadline advanced so the key sorts after the cursor."""
        key = encode_key(deadline, item_id)
        cursor = self.cursor
        if key <= cursor:
            cd = key_deadline(cursor)
            deadline = cd if item_id > key_id(cursor) else cd + 1
            key = encode_key(deadline, item_id)
        return deadline, key

    # ------------------------------------------------------------------ enqueue

    def enqueue(
        self,
        prepared: Sequence[tuple[int, bytes]],
        stats: tuple[int, int, int] | None = None,
        keys: Sequence[str | None] | None = None,
        origin: str | None = None,
        now: int | None = None,
        extra_meta: bytes = b"",
    ) -> Future[list[Enqueued]]:
        """Enqueue (deadline, value) pairs, already validated. ``stats`` for dead letters
        and redrives; ``keys`` (idempotency) and ``origin`` (the queue a dead letter came
        from) travel in the same log record as the items (``storage/itemmeta.py``), and
        so does ``extra_meta`` (metadata entries of the batch: a schedule's progress);
        ``now``: the engine's clock as the caller read it (read here if not given)."""
        if now is None:
            now = self.engine.now()
        st = encode_stats(*stats) if stats is not None else encode_stats(now, 0, 0)
        with self.lock:
            if self.health.failed is not None or self.closed:
                self.check_open()
            if self.stalled():
                self.retry_rotation()
                self.files.warn_stalled(self.fill())
                raise WriteStall("writes are stalled while segment files are written; retry")
            window = self.config.dedup_window_ms
            if keys is not None and window > 0 and any(k is not None for k in keys):
                return self._enqueue_keyed(prepared, st, keys, now, window, extra_meta)
            first = self.next_id
            fut = self._write_pending(prepared, st, now, extra_meta, origin)
        self.engine.emit("enqueued", self.name, range(first, first + len(prepared)))
        return fut

    def _enqueue_keyed(
        self,
        prepared: Sequence[tuple[int, bytes]],
        st: bytes,
        keys: Sequence[str | None],
        now: int,
        window: int,
        extra_meta: bytes,
    ) -> Future[list[Enqueued]]:
        """An enqueue where some items carry keys (under the lock): only the items whose
        key is new (or that have none) are written (``storage/dedup.py``)."""
        meta = self.meta
        batch = split_keyed(meta, keys, now, window)
        fresh = batch.fresh
        if fresh:
            first = self.next_id
            try:
                fut = self._write_pending(
                    [prepared[i] for i in fresh], st, now, extra_meta, keyed=batch
                )
            except BaseException:
                batch.refused(meta)
                raise
            batch.submitted(meta, fut)
            self.engine.emit("enqueued", self.name, range(first, first + len(fresh)))
        return batch.answer()

    def _write_pending(
        self,
        prepared: Sequence[tuple[int, bytes]],
        st: bytes,
        now: int,
        extra_meta: bytes = b"",
        origin: str | None = None,
        keyed: KeyedBatch | None = None,
    ) -> Future[Any]:
        """Give the items ids and keys after the cursor, frame them as one log record and
        submit it (under the lock, the queue checked open and not stalled)."""
        first = self.next_id
        n = len(prepared)
        self.next_id += n
        pack = PENDING_HEADER.pack
        parts: list[bytes] = []
        pairs: list[tuple[bytes, bytes]] = []
        results: list[Enqueued] = []
        meta: list[bytes] = []
        cursor = self.cursor
        item_id = first
        for deadline, value in prepared:
            key = ((deadline << 66) | (item_id << 2)).to_bytes(16, "big")  # encode_key
            if key <= cursor:  # placed after the cursor (``Queue._place``)
                deadline, key = self._place(deadline, item_id)
            parts += (pack(key, st, len(value)), value)
            pairs.append((key, value))
            results.append(Enqueued(item_id, deadline))
            if origin is not None:
                meta.append(encode_origin_entry(item_id, origin))
                self.meta.origins[item_id] = origin
            item_id += 1
        self.rates.add("enqueue", n, now)
        if keyed is not None:
            meta = keyed.remember(self.meta, results)
        token = self.commit.hold(pairs[0][0] if n == 1 else min(pairs)[0])
        batch = PendingBatch(
            self.files.memseg,
            results if keyed is None else None,
            keyed=pairs,
            stats=st,
            token=token,
            remembered=None if keyed is None else keyed.new_entries,
            wakes=True,
        )
        return self._submit(batch, b"".join(parts), b"".join(meta) + extra_meta)

    # ------------------------------------------------------------------ the write path

    def hold(self, key: bytes) -> int:
        """Bar dequeue from passing ``key`` until ``unhold`` (the token returned): for
        a write whose entries are not published yet. Call under the lock."""
        return self.commit.hold(key)

    def unhold(self, token: int) -> None:
        """Lift the barrier ``hold`` returned ``token`` for (no matter if lifted already)."""
        self.commit.unhold(token)

    def _submit(self, batch: PendingBatch, payload: bytes, meta: bytes = b"") -> Future[Any]:
        """Append ``batch``'s record (under the lock); its future resolves with
        ``batch.result`` once it is durable per the fsync mode and published.

        ``always``: the batch waits for the next sync round (the syncer's, or the one
        its caller's thread runs). Otherwise the record is written at once and the
        batch published; a failed write fails the queue. A refused batch is rolled back.
        """
        commit = self.commit
        try:
            commit.append(batch, payload, meta)
        except ReplicationStalled:
            self._roll_back(batch)
            raise
        mode = self.engine.config.fsync
        if mode == "always":
            assert self.engine.syncer is not None
            self.engine.syncer.mark_dirty(self)
        else:
            try:
                commit.write_now()
            except BaseException as exc:
                self._roll_back(batch)
                answer(self._fail_locked(exc, "writing the log"))
                if isinstance(exc, StorageError):
                    raise
                assert self.health.failed is not None
                raise self.health.failed from exc
            self._publish(batch)
            settle(batch.future, batch.result)
            if mode == "interval" and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        if self.fill() >= self.engine.config.memseg_bytes:
            answer(self._request_rotation())
        return batch.future

    def _publish(self, batch: PendingBatch) -> None:
        """Make a durable batch's entries visible (under the lock), lift its barrier, and
        tell the watchers if it made entries due (each publication wakes one waiting
        long-poll, ``storage/waits.py``)."""
        mem = batch.mem
        if batch.keyed is not None:
            mem.add_pending(batch.keyed, batch.stats)
        if batch.entries is not None:
            add = mem.add
            for key, stats, value in batch.entries:
                add(key, stats, value)
        if batch.behind:
            mem.add_tombstones_behind(batch.behind)
        if batch.remembered is not None:
            for entry in batch.remembered:  # committed: a repeat is answered at once
                entry.pending = None
        if batch.load_meta:
            where = f"replicated record of queue {self.name}"
            self.meta.load(batch.load_meta, where, self.engine.now(), self.config.dedup_window_ms)
        if batch.token:
            self.commit.unhold(batch.token)
        if batch.wakes:
            self.notify()

    def _roll_back(self, batch: PendingBatch) -> None:
        """Undo what a refused batch held in memory: its barrier, the leases it took."""
        if batch.token:
            self.commit.unhold(batch.token)
        if batch.restore is not None:
            leases = self.leases
            for item_id, lease in batch.restore:
                if item_id not in leases:
                    leases.restore(item_id, lease)

    def _published(self, batches: list[PendingBatch]) -> list[Answer]:
        """Publish ready batches in order; their answers (settle them outside the lock)."""
        publish = self._publish
        done: list[Answer] = []
        for batch in batches:
            publish(batch)
            done.append((batch.future, batch.result, None))
        return done

    def _complete(self, wal: WalWriter, seq: int) -> list[Answer]:
        """``wal`` is synced up to ``seq``: publish what is now ready; return the answers."""
        return self._published(self.commit.synced(wal, seq))

    def notify(self) -> None:
        """Tell the watchers (``Engine.watch``) that entries were published."""
        for cb in list(self.watchers):
            try:
                cb()
            except Exception:
                log.exception("queue watcher failed")

    def sync_round(self) -> float:
        """Called by the syncer: write and sync what is buffered, then publish it.
        Returns the seconds the write and the sync took (a committing thread backs off
        a slow disk with it, ``storage/syncer.py``). Any write or sync error fails the
        queue, in every mode (``_fail_locked``)."""
        commit = self.commit
        with self.lock:
            if not self.loaded or self.health.failed is not None or self.closed:
                return 0.0
            wal, data, seq = commit.take_round()
        started = time.perf_counter()
        error = commit.write_round(wal, data)
        took = time.perf_counter() - started
        with self.lock:
            if error is not None:
                answers = self._fail_locked(error, "syncing the log")
            elif self.engine.config.fsync == "always":
                answers = self._complete(wal, seq)
                if self.files.rotate_requested and not self.closed and self.health.failed is None:
                    answers += self._rotate_locked()
            else:
                answers = []
            if any(e is None for _f, _r, e in answers):
                self.notify()
        answer(answers)
        return took

    # ------------------------------------------------------------------ a replica group's leader

    @property
    def last_lsn(self) -> int:
        """The lsn of the last record shipped for this queue (its creation's included)."""
        return self.commit.last_lsn

    @last_lsn.setter
    def last_lsn(self, lsn: int) -> None:
        self.commit.last_lsn = lsn

    def awaits_commit(self) -> bool:
        """Some write waits for its sync or its commit (read without the lock: a hint)."""
        return bool(self.commit.waiting)

    def publish_committed(self, now: float) -> list[Answer]:
        """The replica group's commit lsn moved (``Engine.commit``): publish what is now
        synced and committed, and answer ``ReplicationTimeout`` to replicated writes
        that waited past their deadline (``now``, monotonic seconds). Call under the
        lock; settle the answers once it is let go."""
        answers = self._published(self.commit.ready())
        if answers:
            self.notify()
        return answers + self.commit.overdue(now)

    def drop_replicated(self, error: BaseException) -> list[Answer]:
        """Forget every waiting replicated batch (the sink that numbered it is gone):
        undo what it held in memory and answer ``error``; the next record shipped is
        numbered by the next sink. Its record stays in the log; a node that stops
        leading replaces its queues with the leader's copy. Call under the lock."""
        out: list[Answer] = []
        for batch in self.commit.refuse_replicated():
            self._roll_back(batch)
            out.append((batch.future, None, error))
        return out

    # ------------------------------------------------------------------ the log's size

    def fill(self) -> int:
        """How full the current log is, in bytes: its size, or the memory its in-memory
        segment takes if that is more (small values cost far more in memory than in the
        log), so ``memseg_bytes`` bounds both."""
        return max(self.commit.wal.size, self.files.memseg.bytes)

    def stalled(self) -> bool:
        """Writes wait: the log is twice over its limit while segment files are written."""
        return self.fill() > 2 * self.engine.config.memseg_bytes

    @property
    def segments(self) -> list[SegmentReader]:
        """The segment files, oldest first (for tools and tests; ``files`` has them)."""
        return self.files.segments

    # ------------------------------------------------------------------ rotation

    def _request_rotation(self) -> list[Answer]:
        if self.engine.config.fsync == "always":
            self.files.rotate_requested = True
            return []
        return self._rotate_locked()

    def retry_rotation(self) -> None:
        """Writes are stalled: rotate now, or try the pending rotation again (when its
        backoff allows). A stall need not follow a rotation asked for: with ``always``
        a batch's entries reach memory only when its sync round publishes them, after
        the check that asks, and one batch of small entries (a purge's tombstones) can
        take the in-memory segment from under its limit to over twice it."""
        self.files.rotate_requested = True
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
        files, commit, config = self.files, self.commit, self.engine.config
        if not files.may_rotate(config.max_frozen):
            return []
        old = commit.wal
        no = old.segment_no + 1
        try:
            new = WalWriter.create(self.directory, no, self.next_id, config.wal_prealloc_bytes)
        except Exception as exc:
            files.rotation_failed(no, old.segment_no, exc)
            return []
        files.rotation_started()
        try:
            old.close(sync=config.fsync != "never")
        except Exception as exc:
            new.abandon()
            fileio.remove(new.path)
            return self._fail_locked(exc, "closing the log for rotation")
        answers = self._complete(old, old.appended_seq)
        ro, frozen = files.rotated(old.path, no)
        commit.wal = new
        self._schedule_freeze(ro, frozen)
        return answers

    # ------------------------------------------------------------------ freezing

    def _schedule_freeze(self, path: str, mem: MemSegment) -> None:
        """Have the compaction worker write the segment file of the closed log ``path``."""
        gen = self.files.generation
        fut = self.engine.compactor.submit(freeze_log, path, self.directory)
        fut.add_done_callback(lambda f: self._install_frozen(path, mem, f, gen))

    def _install_frozen(self, path: str, mem: MemSegment, fut: Future[Any], gen: int) -> None:
        """A freeze finished: install its segment file (``SegmentSet.install_frozen``),
        then carry on with a rotation that waited for it. Any failure here, or in the
        freeze itself, is retried (``_freeze_failed``)."""
        answers: list[Answer] = []
        files = self.files
        try:
            result: FreezeResult = fut.result()
            with self.lock:
                if self.closed or gen != files.generation:
                    return
                files.install_frozen(path, mem, result, self.cursor)
                if files.rotate_requested and self.health.failed is None:
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
            if self.closed or gen != self.files.generation:
                return
            delay = self.files.freeze_failed(path, exc)
            self.call_later(delay, lambda: self._retry_freeze(path, mem, gen))

    def _retry_freeze(self, path: str, mem: MemSegment, gen: int) -> None:
        with self.lock:
            if self.closed or gen != self.files.generation or not self.files.is_frozen(mem):
                return
        if os.path.exists(path):
            self._schedule_freeze(path, mem)
            return
        # the log is gone: an earlier attempt wrote the segment and deleted the log, then
        # failed to sync the directory; install what is there
        done: Future[Any] = Future()
        done.set_result(self.files.frozen_result(mem))
        self._install_frozen(path, mem, done, gen)

    def freeze_now(self, timeout: float = 30.0) -> None:
        """Rotate the log now (``Engine.freeze``); waits until the rotation is done."""
        with self.lock:
            self.check_open()
            answers = self._request_rotation()
        answer(answers)
        syncer = self.engine.syncer
        if self.engine.config.fsync != "always" or syncer is None:
            return
        syncer.mark_dirty(self)
        deadline = time.monotonic() + timeout
        while self.files.rotate_requested and time.monotonic() < deadline:
            time.sleep(0.001)

    def freeze_if_idle(self, idle_seconds: float) -> None:
        """Freeze a log holding tombstones after a quiet spell, so merges can use them."""
        answers: list[Answer] = []
        files = self.files
        with self.lock:
            if not self.loaded or self.closed or self.health.failed is not None:
                return
            if files.frozen or files.rotate_requested:
                return
            if files.memseg.tombstone_count == 0:
                return
            if time.monotonic() - self.commit.last_write < idle_seconds:
                return
            answers = self._request_rotation()
            if files.rotate_requested and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        answer(answers)

    # ------------------------------------------------------------------ merging (``MergeSource``)

    def unfrozen_logs(self) -> list[int]:
        """Numbers of logs that have no segment file yet."""
        with self.lock:
            return self.files.unfrozen_logs()

    def segment_descriptions(self) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        with self.lock:
            return self.files.descriptions()

    def merge_idle(self) -> bool:
        """True when a merge could start now (open, healthy, no merge running, and no
        failed merge still backing off)."""
        with self.lock:
            files = self.files
            if files.merge_backing_off():
                return False
            return self.loaded and not (
                self.closed or files.merging or self.health.failed is not None
            )

    def merge(self, start: int, stop: int, *, wait: bool = True) -> Future[Any] | None:
        """Merge ``segments[start:stop]`` (a contiguous range) into one segment file on
        the compaction worker (``SegmentSet.start_merge`` says which ranges may)."""
        with self.lock:
            self.check_open()
            taken = self.files.start_merge(start, stop)
            if taken is None:
                return None
            inputs, drop_rogue = taken
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
        files = self.files
        try:
            path: str | None = fut.result()
        except CompactionCancelled:  # the queue is closing: its inputs stay as they are
            with self.lock:
                files.merge_stopped()
            log.info("queue %s: merge stopped: the queue is closing", self.name)
            return
        except BaseException as exc:
            with self.lock:
                delay = files.merge_failed()
            if not self.closed:
                log.error("queue %s: merge failed: %s; retrying in %.0f s", self.name, exc, delay)
                files.merge_error = exc
            return
        with self.lock:
            files.merge_finished()
            if self.closed:
                return
            files.install_merge(inputs, path, self.cursor)
        self.engine.merge_policy_hook(self)

    # ------------------------------------------------------------------ failing and reopening

    @property
    def failed(self) -> StorageError | None:
        """Why the queue refuses work, or None (``Health``)."""
        return self.health.failed

    @property
    def quarantined(self) -> bool:
        """Damaged on disk: it refuses work until an operator repairs it and restarts."""
        return self.health.quarantined

    def check_open(self) -> None:
        """Raise why the queue refuses work, if it does (a failed queue whose reopening
        is due is reopened first). Call under the lock."""
        if self.health.failed is not None:
            self._recover_locked()
        if self.health.failed is not None:
            raise self.health.failed
        if self.closed:
            raise EngineUnavailable("queue is closed", queue=self.name)

    def _fail_locked(self, exc: BaseException, what: str) -> list[Answer]:
        """Fail the queue after a write or sync error (call under the lock).

        After a failed write or fsync the page cache cannot be trusted to say what is
        on disk, so nothing more is acknowledged: every waiting batch is refused and
        rolled back, records still buffered are discarded (a refused operation must
        never happen later), and the queue refuses work until it is reopened from disk.
        On a replica group's leader a batch already shipped is answered "unknown"
        (``ReplicationTimeout``), not refused: the followers may hold it, and a member
        that takes over makes it visible.
        """
        health, commit = self.health, self.commit
        error = health.refusal(exc, what)
        if health.failed is None and self.engine.replication is not None:
            # a leader's log may now hold records its followers do not: step down
            self.engine.replication.local_failure(self.name, error)
        health.fail(exc, what)
        if self.loaded:
            commit.wal.discard_buffer()
            try:  # before anyone hears "refused": a crash now must not bring it back
                commit.cut_back()
            except Exception as cut_exc:  # tried again when the queue reopens
                log.error("queue %s: cutting the log back failed: %s", self.name, cut_exc)
        answers: list[Answer] = []
        in_doubt: BaseException | None = None
        for batch in reversed(commit.refuse_all()):
            self._roll_back(batch)
            if batch.lsn:  # shipped: the followers may hold it, and it may commit there
                in_doubt = in_doubt or ReplicationTimeout(
                    f"{what} failed on the leader after the write was sent to the replica "
                    "group: its outcome is unknown (another member may make it visible)",
                    queue=self.name,
                )
                answers.append((batch.future, None, in_doubt))
            else:
                answers.append((batch.future, None, error))
        return answers

    def recover_if_due(self) -> None:
        """Reopen a failed queue from disk when its retry is due (the restart path)."""
        with self.lock:
            self._recover_locked()

    def _recover_locked(self) -> None:
        health = self.health
        if self.closed or not health.recovery_due() or self.files.merging:
            return
        try:
            if self.loaded:
                self.commit.cut_back()
            self.files.drop()
            self.loaded = False
            self._load()
        except CorruptionError as exc:
            health.quarantine(exc)
            return
        except Exception as exc:
            health.reopen_failed(exc)
            return
        health.reopened()

    # ------------------------------------------------------------------ settings

    def set_config(self, config: QueueConfig) -> None:
        """Replace the queue's config, durably (``queue.json``); call under the lock."""
        save_config(self.directory, config)
        self.config = config

    def set_state(self, state: QueueState) -> None:
        """Replace the queue's operator state, durably (``state.json``); call under the
        lock."""
        save_state(self.directory, state)
        self.state = state

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` after ``delay`` seconds on a timer thread, unless the queue has
        closed by then (closing cancels the timer)."""

        def run() -> None:
            with self.lock:
                self._timers.discard(timer)
                if self.closed:
                    return
            fn()

        timer = threading.Timer(delay, run)
        timer.daemon = True
        with self.lock:
            self._timers.add(timer)
        timer.start()

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            marker = os.path.join(self.directory, "merge.cancel")
            if self.files.merging:
                with open(marker, "wb"):
                    pass
        self.engine.compactor.wait_idle(timeout=120)
        answers: list[Answer] = []
        with self.lock:
            self.closed = True
            for timer in self._timers:
                timer.cancel()
            if self.loaded and self.health.failed is None:
                wal = self.commit.wal
                try:
                    wal.close(sync=self.engine.config.fsync != "never")
                    answers = self._complete(wal, wal.appended_seq)
                except Exception as exc:
                    answers = self._fail_locked(exc, "closing the log")
            elif self.loaded:
                self.commit.wal.abandon()
            gone = EngineUnavailable("queue is closed", queue=self.name)
            # on a replica group's leader, a write still waiting for its sync set is on
            # the followers: closed under it (a deletion), its outcome is unknown
            in_doubt = ReplicationTimeout(
                "the queue was closed before the replica group acknowledged the write; "
                "its outcome is unknown",
                queue=self.name,
            )
            answers += [
                (b.future, None, in_doubt if b.lsn else gone) for b in self.commit.refuse_all()
            ]
            self.files.close()
            fileio.remove(marker)
        answer(answers)
