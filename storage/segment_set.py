"""The queue's set of logs and segment files: rotation, freezing, installs and merges.

What this owns: rotating the log when it is full (``fill``/``stalled``), freezing a
closed log into a segment file on the compaction worker (retried with a backoff until
it succeeds), installing finished segment files into the merged view, and merging a
contiguous range of segment files.

Invariants: a rotation is all or nothing (the next log exists before the current one
is closed); a frozen log's ``.log_ro`` is deleted (and the deletion synced) before its
segment file joins the set merges may read, so a merge output never covers a log that
still exists; a merge never spans a log that has no segment file yet.
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.storage import fileio
from dq.storage.compactor import CompactionCancelled, FreezeResult, freeze_log, merge_segments
from dq.storage.errors import InvalidArgument
from dq.storage.memseg import MemSegment
from dq.storage.merge_policy import SegmentDesc
from dq.storage.queue_commit import Answer, answer
from dq.storage.queue_core import QueueCore
from dq.storage.queue_failure import backoff
from dq.storage.segment import SegmentReader, segment_name
from dq.storage.wal import WalWriter

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["SegmentSetMixin"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs

#: a stall of writes is logged at most this often per queue
STALL_WARNING_S = 60.0


class SegmentSetMixin(QueueCore):
    """Rotation, freezing, installs and merges of a queue's files."""

    # ------------------------------------------------------------------ rotation

    def _request_rotation(self: Queue) -> list[Answer]:
        if self.engine.config.fsync == "always":
            self._rotate_requested = True
            return []
        return self._rotate_locked()

    def fill(self: Queue) -> int:
        """How full the current log is, in bytes: its size, or the memory its in-memory
        segment takes if that is more (small values cost far more in memory than in the
        log), so ``memseg_bytes`` bounds both."""
        return max(self.wal.size, self.memseg.bytes)

    def stalled(self: Queue) -> bool:
        """Writes wait: the log is twice over its limit while segment files are written."""
        return self.fill() > 2 * self.engine.config.memseg_bytes

    def _warn_stalled(self: Queue) -> None:
        """Say in the log that writes are refused with ``write_stall`` (at most once a
        minute): a compaction worker that hangs fails nothing, so without this line the
        operator would see only clients' 503s (the server waits each out for 30 s)."""
        now = time.monotonic()
        if now - self._stall_warned_at < STALL_WARNING_S:
            return
        self._stall_warned_at = now
        log.warning(
            "queue %s: writes refused (write_stall): the log holds %d bytes, twice its limit, "
            "while %d frozen log(s) wait for their segment files (%s)",
            self.name,
            self.fill(),
            len(self.frozen),
            "a freeze is failing and retried"
            if self._freeze_delay
            else "the compaction worker has not finished them",
        )

    def retry_rotation(self: Queue) -> None:
        """Writes are stalled: try the pending rotation again (when its backoff allows)."""
        if not self._rotate_requested:
            return
        if self.engine.config.fsync == "always":
            assert self.engine.syncer is not None
            self.engine.syncer.mark_dirty(self)
        else:
            answer(self._rotate_locked())

    def _rotate_locked(self: Queue) -> list[Answer]:
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
            self._rotate_delay = backoff(self._rotate_delay)
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

    def _schedule_freeze(self: Queue, path: str, mem: MemSegment) -> None:
        gen = self._generation
        fut = self.engine.compactor.submit(freeze_log, path, self.directory)
        fut.add_done_callback(lambda f: self._install_frozen(path, mem, f, gen))

    def _install_frozen(
        self: Queue, path: str, mem: MemSegment, fut: Future[Any], gen: int
    ) -> None:
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

    def _freeze_failed(
        self: Queue, path: str, mem: MemSegment, exc: BaseException, gen: int
    ) -> None:
        """Retry a failed freeze (disk full, descriptors, a killed worker) with a backoff,
        until it succeeds: the log stays in memory and on disk meanwhile."""
        with self.lock:
            if self.closed or gen != self._generation:
                return
            self.counters["freeze_failures"] += 1
            delay = backoff(self._freeze_delay.get(path, 0.0))
            self._freeze_delay[path] = delay
            log.error(
                "queue %s: freezing %s failed (%s); retrying in %.2f s", self.name, path, exc, delay
            )
            self.merge_error = exc
            timer = threading.Timer(delay, self._retry_freeze, (path, mem, gen))
            timer.daemon = True
            self._timers.add(timer)
            timer.start()

    def _retry_freeze(self: Queue, path: str, mem: MemSegment, gen: int) -> None:
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

    def freeze_now(self: Queue, timeout: float = 30.0) -> None:
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
        while self._rotate_requested and time.monotonic() < deadline:
            time.sleep(0.001)

    def unfrozen_logs(self: Queue) -> list[int]:
        """Numbers of logs that have no segment file yet."""
        with self.lock:
            return [m.segment_no for _, m in self.frozen] + [self.memseg.segment_no]

    def segment_descriptions(self: Queue) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        with self.lock:
            return [
                SegmentDesc(
                    r.seg_lo, r.seg_hi, r.info.pending_count, r.info.tombstone_count, r.file_size
                )
                for r in self.segments
            ]

    def merge_idle(self: Queue) -> bool:
        """True when a merge could start now (open, healthy, no merge running, and no
        failed merge still backing off)."""
        with self.lock:
            if time.monotonic() < self._merge_retry_at:
                return False
            return self.loaded and not (self.closed or self._merging or self.failed is not None)

    def freeze_if_idle(self: Queue, idle_seconds: float) -> None:
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

    def merge(self: Queue, start: int, stop: int, *, wait: bool = True) -> Future[Any] | None:
        """Merge ``segments[start:stop]`` (a contiguous range) into one segment file.

        Tombstones whose pending entry is outside the range are kept (rogue), unless
        the range starts at the oldest segment and no older log is waiting for its
        segment file, where nothing older could need them. A range whose log numbers
        span a log that has no segment file yet is refused: the output's name would
        claim that log, and recovery would take the claim for a fact.
        """
        with self.lock:
            self.check_open()
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

    def _install_merge(self: Queue, inputs: list[SegmentReader], fut: Future[Any]) -> None:
        try:
            path: str | None = fut.result()
        except CompactionCancelled:  # the queue is closing: its inputs stay as they are
            with self.lock:
                self._merging = False
            log.info("queue %s: merge stopped: the queue is closing", self.name)
            return
        except BaseException as exc:
            with self.lock:
                self._merging = False
                # A merge is only housekeeping, and one that failed (a full disk, a killed
                # worker) would fail again at once: the policy would restart it at every
                # maintenance tick, rereading every input and logging an error twice a
                # second for as long as the disk stays full. Wait 1 s, doubling to 60 s.
                self._merge_delay = min(max(self._merge_delay * 2, 1.0), 60.0)
                self._merge_retry_at = time.monotonic() + self._merge_delay
            if not self.closed:
                log.error(
                    "queue %s: merge failed: %s; retrying in %.0f s",
                    self.name,
                    exc,
                    self._merge_delay,
                )
                self.merge_error = exc
            return
        with self.lock:
            self._merging = False
            self._merge_delay = 0.0
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
