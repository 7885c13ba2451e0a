"""A queue's file jobs: rotating its log, freezing each closed log into a segment file,
merging segment files — when each runs, installing what the compaction worker wrote,
and trying again what failed.

When: a log is rotated once it is full (``fill``: its bytes, or its in-memory
segment's memory if more) and fewer than ``max_frozen`` closed logs wait for their
segment files; with fsync ``always`` a sync round does it (``Queue.sync_round``), in
the other modes the write that filled it, or the install of a freeze that made room.
Writes stall (``stalled``) while the log is twice over its limit. A closed log is
frozen on the compaction worker at once; a failed freeze is tried again with a backoff
until it succeeds (the log stays in memory and on disk meanwhile). Merges run when the
merge policy asks (``Queue`` is its ``MergeSource``); a failed one makes it wait.

It is given the parts it coordinates: ``GroupCommit`` (the log it switches),
``SegmentSet`` (the in-memory segments and segment files, and the bookkeeping of
these jobs: requests, backoffs, the generation that voids the jobs of an earlier
load), ``Deliveries`` (the cursor a new segment file is placed after), ``Health``, and
``Failing`` (a log that cannot be closed fails the queue). It calls nothing of the
queue: the queue is only handed to the syncer and to the merge policy (``owner``, held
weakly: the queue holds its jobs), which call it later, and the batches a closed log
made durable are published by the caller between the two steps of a rotation
(``begin_rotation``, ``end_rotation``).

Invariants (``SegmentSet`` keeps the ones on its own state): the next log is created
before the current one is closed, so a rotation that cannot start leaves the queue on
its log, still writable; a job started before the queue reloaded installs nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dq.storage import fileio
from dq.storage.compactor import CompactionCancelled, FreezeResult, freeze_log, merge_segments
from dq.storage.errors import EngineUnavailable, WriteStall
from dq.storage.futures import Answer, answer
from dq.storage.merge_policy import MergeSource, SegmentDesc
from dq.storage.prealloc import allocation_step
from dq.storage.syncer import SyncTarget
from dq.storage.wal import WalWriter

if TYPE_CHECKING:
    from dq.storage.compactor import Compactor
    from dq.storage.config import EngineConfig
    from dq.storage.deliveries import Deliveries
    from dq.storage.failing import Failing
    from dq.storage.group_commit import GroupCommit
    from dq.storage.health import Health
    from dq.storage.itemmeta import ItemMeta
    from dq.storage.memseg import MemSegment
    from dq.storage.segment import SegmentReader
    from dq.storage.segment_set import SegmentSet
    from dq.storage.syncer import InlineCommits, Syncer
    from dq.storage.timers import Timers

__all__ = ["FileJobs", "JobsHost", "JobsOwner", "Rotation"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class JobsHost(Protocol):
    """What the file jobs need from the engine."""

    config: EngineConfig
    syncer: Syncer | None
    compactor: Compactor

    def merge_policy_hook(self, source: MergeSource) -> None: ...


class JobsOwner(SyncTarget, MergeSource, Protocol):
    """The queue, as the syncer and the merge policy know it."""


@dataclass(slots=True)
class Rotation:
    """A rotation between its two steps: the closed log, and the next one."""

    old: WalWriter
    new: WalWriter
    no: int


class FileJobs:
    """The file jobs of one queue; methods named for the lock run under the queue's
    lock, the others take it."""

    def __init__(
        self,
        name: str,
        directory: str,
        lock: threading.RLock,
        host: JobsHost,
        owner: JobsOwner,
        *,
        commit: GroupCommit,
        files: SegmentSet,
        deliveries: Deliveries,
        health: Health,
        failing: Failing,
        timers: Timers,
        meta: ItemMeta,
    ) -> None:
        self.name = name
        self.directory = directory
        self.lock = lock
        self.host = host
        #: the queue, held weakly: it holds these jobs, and a strong reference back
        #: would make every queue a reference cycle, kept with its in-memory segments
        #: and segment readers until the cycle collector ran after the queue was closed
        #: and dropped (``owner``)
        self._owner = weakref.ref(owner)
        self.commit = commit
        self.files = files
        self.deliveries = deliveries
        self.health = health
        self.failing = failing
        self.timers = timers
        #: the item metadata of the current load (a freeze's install lets go of what
        #: its log's sidecar now holds); set again each time the queue loads
        self.meta = meta
        #: while this file exists the compaction worker stops the running merge
        self.cancel_marker = os.path.join(directory, "merge.cancel")

    @property
    def owner(self) -> JobsOwner:
        """The queue, for the syncer and the merge policy. Only a job's callback can
        outlive it, and each of those returns once the queue is closed, before it asks."""
        owner = self._owner()
        if owner is None:
            raise EngineUnavailable("queue is closed", queue=self.name)
        return owner

    # ------------------------------------------------------------------ the log's size

    def fill(self) -> int:
        """How full the current log is, in bytes: its size, or the memory its in-memory
        segment takes if that is more (small values cost far more in memory than in the
        log), so ``memseg_bytes`` bounds both."""
        return max(self.commit.wal.size, self.files.memseg.bytes)

    def stalled(self) -> bool:
        """Writes wait: the log is twice over its limit while segment files are written."""
        limit = 2 * self.host.config.memseg_bytes  # ``fill`` without its call: every write asks
        return self.commit.wal.size > limit or self.files.memseg.bytes > limit

    def refuse_if_stalled(self, inline: InlineCommits | None = None) -> None:
        """Raise ``WriteStall`` while writes are stalled, having asked again for the
        rotation that ends the stall: the one rule every record obeys before it is
        appended, a client's write on a leader or alone and a leader's record on a
        follower (``Queue.apply_record``), so no log outgrows twice ``memseg_bytes``
        by more than one record. Under the lock; the caller waits the stall out."""
        if self.stalled():
            self.retry_rotation(inline)
            self.files.warn_stalled(self.fill())
            raise WriteStall("writes are stalled while segment files are written; retry")

    # ------------------------------------------------------------------ rotation

    def request_rotation(self) -> list[Answer]:
        """The log is full: rotate it now, or (``always``) at the next sync round. Under
        the lock; the answers of a failure."""
        if self.host.config.fsync == "always":
            self.files.rotate_requested = True
            return []
        return self._rotate_now()

    def retry_rotation(self, inline: InlineCommits | None = None) -> None:
        """Writes are stalled: rotate now, or try the pending rotation again (when its
        backoff allows). A stall need not follow a rotation asked for: with ``always``
        a batch's entries reach memory only when its sync round publishes them, after
        the check that asks, and one batch of small entries (a purge's tombstones) can
        take the in-memory segment from under its limit to over twice it. Under the
        lock."""
        self.files.rotate_requested = True
        if self.host.config.fsync == "always":
            if inline is None or not inline.take(self.owner):
                assert self.host.syncer is not None
                self.host.syncer.mark_dirty(self.owner)
        else:
            answer(self._rotate_now())

    def begin_rotation(self) -> tuple[list[Answer], Rotation | None]:
        """Start the next log and close the current one: all or nothing (under the lock).

        The next log is created first. If that fails the queue stays on its current
        log, still writable, and the rotation is retried with a backoff. Then the
        current log is closed (its buffer written and synced): if that fails, the queue
        fails like any failed sync, and the answers of every waiter are returned. Else
        the caller publishes what the closed log made durable, then ``end_rotation``.
        """
        files, commit, config = self.files, self.commit, self.host.config
        if not files.may_rotate(config.max_frozen):
            return [], None
        old = commit.wal
        no = old.segment_no + 1
        try:
            new = WalWriter.create(self.directory, no, commit.next_id, allocation_step(config))
        except Exception as exc:
            files.rotation_failed(no, old.segment_no, exc)
            return [], None
        files.rotation_started()
        try:
            old.close(sync=config.fsync != "never")
        except Exception as exc:
            new.abandon()
            fileio.remove(new.path)
            return self.failing.fail(exc, "closing the log for rotation"), None
        return [], Rotation(old, new, no)

    def end_rotation(self, rotation: Rotation) -> None:
        """Writes go to the next log; the closed one is frozen (under the lock)."""
        ro, frozen = self.files.rotated(rotation.old.path, rotation.no)
        self.commit.wal = rotation.new
        self.freeze(ro, frozen)

    def _rotate_now(self) -> list[Answer]:
        """A rotation in the modes without sync rounds (``interval``, ``never``), where
        no batch waits for its log's sync (``GroupCommit.append``): closing the log
        leaves nothing to publish."""
        refused, rotation = self.begin_rotation()
        if rotation is not None:
            self.end_rotation(rotation)
        return refused

    def await_rotation(self, timeout: float) -> None:
        """With ``always``, have the syncer carry out the rotation asked for and wait
        until it is done (``Engine.freeze``), at most ``timeout`` seconds; without the
        lock.

        A sync round tries the rotation only when nothing keeps it back; one that fails
        to start the next log (a full disk, no descriptor) backs off and is tried again
        only at a later round, which no write may bring. So while it waits, each time
        the backoff allows a try it asks the syncer for a round again, and a transient
        fault costs the caller the backoff, not the whole timeout. A queue that fails
        meanwhile (its log could not be closed) will not rotate: its failure is raised,
        as any call on it raises it."""
        syncer = self.host.syncer
        if self.host.config.fsync != "always" or syncer is None:
            return
        files, health, max_frozen = self.files, self.health, self.host.config.max_frozen
        syncer.mark_dirty(self.owner)
        deadline = time.monotonic() + timeout
        while files.rotate_requested and time.monotonic() < deadline:
            failed = health.failed
            if failed is not None:
                raise failed
            if health.closed:
                raise EngineUnavailable("queue is closed", queue=self.name)
            if files.rotation_retry_due(max_frozen):
                syncer.mark_dirty(self.owner)
            time.sleep(0.001)

    # ------------------------------------------------------------------ freezing

    def freeze(self, path: str, mem: MemSegment) -> None:
        """Have the compaction worker write the segment file of the closed log ``path``."""
        gen = self.files.generation
        fut = self.host.compactor.submit(freeze_log, path, self.directory)
        fut.add_done_callback(lambda f: self._install_frozen(path, mem, f, gen))

    def _install_frozen(self, path: str, mem: MemSegment, fut: Future[Any], gen: int) -> None:
        """A freeze finished: install its segment file (``SegmentSet.install_frozen``),
        then carry on with a rotation that waited for it. Any failure here, or in the
        freeze itself, is retried (``_freeze_failed``)."""
        answers: list[Answer] = []
        files, health = self.files, self.health
        try:
            result: FreezeResult = fut.result()
            meta = self.meta
            # the reasons written in this log are in its sidecar now: read where, so
            # that memory lets go of their texts (``storage/reasons.py``)
            in_sidecar = meta.frozen(self.directory, mem.segment_no)
            with self.lock:
                if health.closed or gen != files.generation:
                    return
                files.install_frozen(path, mem, result, self.deliveries.cursor)
                if in_sidecar is not None and meta is self.meta:
                    meta.errors.frozen(mem.segment_no, in_sidecar)
                if files.rotate_requested and health.failed is None:
                    if self.host.config.fsync == "always":
                        assert self.host.syncer is not None
                        self.host.syncer.mark_dirty(self.owner)
                    else:
                        answers = self._rotate_now()
        except Exception as exc:
            self._freeze_failed(path, mem, exc, gen)
            return
        answer(answers)
        self.host.merge_policy_hook(self.owner)

    def _freeze_failed(self, path: str, mem: MemSegment, exc: BaseException, gen: int) -> None:
        """Retry a failed freeze (disk full, descriptors, a killed worker) with a backoff,
        until it succeeds: the log stays in memory and on disk meanwhile."""
        with self.lock:
            if self.health.closed or gen != self.files.generation:
                return
            delay = self.files.freeze_failed(path, exc)
            self.timers.call_later(delay, lambda: self._retry_freeze(path, mem, gen))

    def _retry_freeze(self, path: str, mem: MemSegment, gen: int) -> None:
        files = self.files
        with self.lock:
            if self.health.closed or gen != files.generation or not files.is_frozen(mem):
                return
        if os.path.exists(path):
            self.freeze(path, mem)
            return
        # the log is gone: an earlier attempt wrote the segment and deleted the log, then
        # failed to sync the directory; install what is there
        done: Future[Any] = Future()
        done.set_result(files.frozen_result(mem))
        self._install_frozen(path, mem, done, gen)

    def freeze_if_idle(self, idle_seconds: float) -> None:
        """Freeze a log holding tombstones after a quiet spell, so merges can use them
        (the engine's maintenance)."""
        answers: list[Answer] = []
        files, health = self.files, self.health
        with self.lock:
            if not health.loaded or health.closed or health.failed is not None:
                return
            if files.frozen or files.rotate_requested:
                return
            if files.memseg.tombstone_count == 0:
                return
            if time.monotonic() - self.commit.last_write < idle_seconds:
                return
            answers = self.request_rotation()
            if files.rotate_requested and self.host.syncer is not None:
                self.host.syncer.mark_dirty(self.owner)
        answer(answers)

    # ------------------------------------------------------------------ merging

    def merge_idle(self) -> bool:
        """True when a merge could start now (open, healthy, no merge running, and no
        failed merge still backing off)."""
        files, health = self.files, self.health
        with self.lock:
            if files.merge_backing_off():
                return False
            return health.loaded and not (
                health.closed or files.merging or health.failed is not None
            )

    def merge(self, inputs: list[SegmentReader], drop_rogue: bool, *, wait: bool) -> Future[Any]:
        """Merge ``inputs`` (taken by ``SegmentSet.start_merge``) on the compaction
        worker; its output is installed when it is done. Without the lock."""
        fut = self.host.compactor.submit(
            merge_segments,
            [r.path for r in inputs],
            self.directory,
            drop_rogue=drop_rogue,
            cancel_marker=self.cancel_marker,
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
            if not self.health.closed:
                log.error("queue %s: merge failed: %s; retrying in %.0f s", self.name, exc, delay)
                files.merge_error = exc
            return
        with self.lock:
            files.merge_finished()
            if self.health.closed:
                return
            files.install_merge(inputs, path, self.deliveries.cursor)
        self.host.merge_policy_hook(self.owner)

    def stop_merge(self) -> None:
        """The queue closes: a running merge stops (its inputs stay). Under the lock."""
        if self.files.merging:
            with open(self.cancel_marker, "wb"):
                pass

    def descriptions(self) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        with self.lock:
            return self.files.descriptions()

    def unfrozen_logs(self) -> list[int]:
        """Numbers of logs that have no segment file yet."""
        with self.lock:
            return self.files.unfrozen_logs()
