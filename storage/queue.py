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
- ``queue_failure.py``: failing after an I/O error, quarantine, reopening from disk,
  the open check every operation passes;
- ``queue_commit.py``: group commit (``PendingBatch``, ``_submit``, ``sync_round``);
- ``segment_set.py``: the logs and segment files (rotation, freezing, installs, merges);
- ``queue_items.py``: enqueue, release, requeue, extend, lease expiry, tombstones;
- ``queue_reads.py``: lookup, dequeue, next wake-up, stats;
- ``queue_replica.py``: a replica group's follower applying records, copies for followers;
- ``queue_config.py`` (``queue.json``) and ``validation.py`` (deadlines, leases).

This module opens, loads and closes a queue, and places keys after the cursor.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from dq.storage import fileio
from dq.storage.codec import encode_key, key_deadline, key_id
from dq.storage.errors import CorruptionError, EngineUnavailable, ReplicationTimeout, WriteStall
from dq.storage.itemmeta import ItemMeta
from dq.storage.leases import Leases
from dq.storage.memseg import MemSegment
from dq.storage.queue_commit import Answer, CommitMixin, PendingBatch, answer
from dq.storage.queue_config import CONFIG_FILE, load_config, save_config
from dq.storage.queue_core import QueueHost
from dq.storage.queue_failure import FailureMixin
from dq.storage.queue_items import ItemsMixin
from dq.storage.queue_reads import ReadsMixin
from dq.storage.queue_replica import ReplicaMixin
from dq.storage.queue_state import STATE_FILE, QueueState, load_state, save_state
from dq.storage.recovery import recover_directory
from dq.storage.segment_set import SegmentSetMixin
from dq.storage.types import QueueConfig
from dq.storage.view import MergedView
from dq.storage.wal import WalWriter

__all__ = ["PendingBatch", "Queue", "QueueHost", "WriteStall"]


class Queue(FailureMixin, CommitMixin, SegmentSetMixin, ItemsMixin, ReadsMixin, ReplicaMixin):
    """One queue. Its state is declared in ``QueueCore``; its jobs are mixed in from the
    modules named above, whose methods all run with ``self`` a ``Queue``."""

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
        settings = CONFIG_FILE
        try:
            config = load_config(directory)
            settings = STATE_FILE
            state = load_state(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # name the file that could not be read (the operator rewrites or removes
            # it), and where in it the JSON broke off
            q = cls(engine, name, directory, QueueConfig())
            q._quarantine(
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

    def _place(self, deadline: int, item_id: int) -> tuple[int, bytes]:
        """Key for (deadline, id), deadline advanced so the key sorts after the cursor."""
        key = encode_key(deadline, item_id)
        cursor = self.cursor
        if key <= cursor:
            cd = key_deadline(cursor)
            deadline = cd if item_id > key_id(cursor) else cd + 1
            key = encode_key(deadline, item_id)
        return deadline, key

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
            # on a replica group's leader, a write still waiting for its sync set is on
            # the followers: closed under it (a deletion), its outcome is unknown
            in_doubt = ReplicationTimeout(
                "the queue was closed before the replica group acknowledged the write; "
                "its outcome is unknown",
                queue=self.name,
            )
            answers += [(b.future, None, in_doubt if b.lsn else gone) for b in self._waiting]
            self._waiting = []
            for r in self.segments:
                r.close()
            fileio.remove(marker)
        answer(answers)
