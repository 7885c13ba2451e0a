"""A queue's set of in-memory segments and segment files, and the merged view over them.

What this owns: the in-memory segment of the current log (``memseg``), the frozen ones
whose segment files are being written (``frozen``), the segment files (``segments``),
and ``view``, the merge of all of them that dequeue reads; and the bookkeeping of the
jobs that change the set: rotation (asked for, backing off after a failure), freezes
(retried with a backoff until they succeed), merges (one at a time, backing off after
a failure). ``FileJobs`` (``file_jobs.py``) decides when each job runs (a rotation
also switches the log, ``GroupCommit``'s); this part carries out each step on its own
state.

Invariants: a frozen log's ``.log_ro`` is deleted (and the deletion synced) before its
segment file joins the set merges may read (``install_frozen``), so a merge output never
covers a log that still exists; a merge never spans a log that has no segment file yet
(``start_merge``); a job started before the queue reloaded from disk installs nothing
(``generation``).
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from dq.storage import fileio
from dq.storage.codec import TOMBSTONE, decode_stats
from dq.storage.compactor import FreezeResult
from dq.storage.errors import InvalidArgument
from dq.storage.health import backoff
from dq.storage.memseg import MemSegment
from dq.storage.merge_policy import SegmentDesc
from dq.storage.recovery import Recovered
from dq.storage.segment import SegmentCursor, SegmentReader, segment_name
from dq.storage.view import MergedView
from dq.storage.wal import WalWriter

__all__ = ["STALL_WARNING_S", "SegmentSet"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs

#: a stall of writes is logged at most this often per queue
STALL_WARNING_S = 60.0
#: files a copy leaves out: half-written outputs, merge-cancel markers
_SKIPPED_SUFFIXES = (".tmp", ".cancel")


class SegmentSet:
    """The in-memory segments, segment files and merged view of one queue; every method
    runs under the queue's lock."""

    def __init__(self, name: str, directory: str) -> None:
        self.name = name
        self.directory = directory
        self.memseg = MemSegment(1)
        #: closed logs (``.log_ro``) and their in-memory segments, oldest first
        self.frozen: list[tuple[str, MemSegment]] = []
        #: segment files, by log number
        self.segments: list[SegmentReader] = []
        self.view = MergedView()
        self.view.memsegs = [self.memseg]
        #: bumped whenever the queue is reloaded from disk; older jobs install nothing
        self.generation = 0
        #: the log is full: rotate at the next chance (a sync round, an install)
        self.rotate_requested = False
        self._rotate_delay = 0.0
        self._rotate_retry_at = 0.0
        #: when a write stall was last logged (``warn_stalled``)
        self._stall_warned_at = -1e9
        self._freeze_delay: dict[str, float] = {}
        self.merging = False
        self.merge_error: BaseException | None = None
        #: after a failed merge the policy waits this long before it tries again
        self._merge_delay = 0.0
        self._merge_retry_at = 0.0
        self.freeze_failures = 0
        self.rotation_failures = 0

    def load(self, rec: Recovered) -> None:
        """Take what recovery read from the directory (the queue reloads)."""
        self.generation += 1
        self.segments = rec.segments
        self.view = MergedView()
        self.rotate_requested = False
        for reader in self.segments:
            self.view.add_segment(reader, b"")
        self.memseg = MemSegment(rec.next_segment_no)
        self.frozen = rec.frozen
        self.view.memsegs = self.memsegs()

    def close(self) -> None:
        """Close the segment files (the queue closes)."""
        for reader in self.segments:
            reader.close()

    def drop(self) -> None:
        """Close and forget the segment files (the queue reloads from disk)."""
        self.close()
        self.segments = []

    def memsegs(self) -> list[MemSegment]:
        """The current in-memory segment, then the frozen ones."""
        return [self.memseg, *(m for _, m in self.frozen)]

    def lookup(self, key: bytes, hint: object | None) -> tuple[bytes, bytes] | None:
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

    def count(self, pkey: bytes) -> tuple[int, tuple[bytes, bytes] | None]:
        """(pendings - tombstones, newest pending as (stats, value)) of the pending key
        ``pkey`` over every in-memory segment and segment file: a look-up per in-memory
        segment, one block per segment file whose range holds it. Tombstones not kept in
        memory (a delivered entry's) are not counted: that entry is behind the cursor,
        where only a lease says an item is live."""
        tomb = pkey[:15] + bytes((pkey[15] | TOMBSTONE,))
        net = 0
        pend: list[tuple[bytes, bytes]] = []
        for mem in self.memsegs():
            entries = mem.entries
            found = entries.get(pkey)
            if found is not None:
                net += 1
                pend.append(found)
            if tomb in entries:
                net -= 1
        before = (int.from_bytes(pkey, "big") - 1).to_bytes(16, "big")
        for reader in self.segments:
            if not reader.first_keys or not reader.first_keys[0] <= tomb:
                continue
            if pkey > reader.info.last_key:
                continue
            cur = SegmentCursor(reader, before)
            while cur.key is not None and cur.key <= tomb:
                if cur.key == tomb:
                    net -= 1
                else:
                    _k, stats, value = cur.entry()
                    net += 1
                    pend.append((stats, value))
                cur.advance()
        if not pend:
            return net, None
        return net, max(pend, key=lambda p: decode_stats(p[0])[1])

    def group_of(self, key: bytes, hint: object | None) -> str | None:
        """The group of the pending entry ``key`` wherever it lives now (None: none):
        an in-memory segment's names, or the group column of the file holding it."""
        for mem in (self.memseg, *(m for _, m in self.frozen)):
            if key in mem.entries:
                return mem.group_of(key)
        src = hint
        while src is not None and getattr(src, "replaced_by", None) is not None:
            src = src.replaced_by  # type: ignore[attr-defined]
        readers = [src] if isinstance(src, SegmentReader) and not src.closed else []
        for reader in (*readers, *reversed(self.segments)):
            if not reader.has_groups:
                continue
            if reader.first_keys and reader.first_keys[0] <= key <= reader.info.last_key:
                hit = reader.get_grouped(key)
                if hit is not None:
                    return hit[2]
        return None

    # ------------------------------------------------------------------ rotation

    def may_rotate(self, max_frozen: int) -> bool:
        """Note that the log is to rotate; True if it may now (not too many frozen logs
        waiting for their segment files, no failed attempt still backing off)."""
        self.rotate_requested = True
        if len(self.frozen) >= max_frozen:
            return False  # retried when a freeze is installed
        return time.monotonic() >= self._rotate_retry_at

    def rotation_retry_due(self, max_frozen: int) -> bool:
        """A rotation is asked for and nothing keeps it from being tried now: no failed
        attempt still backing off, and room for one more closed log (without room it is
        tried again when a freeze is installed)."""
        return (
            self.rotate_requested
            and len(self.frozen) < max_frozen
            and time.monotonic() >= self._rotate_retry_at
        )

    def rotation_failed(self, no: int, current: int, exc: BaseException) -> None:
        """Log ``no`` could not be created: stay on log ``current``, try again later."""
        self.rotation_failures += 1
        self._rotate_delay = backoff(self._rotate_delay)
        self._rotate_retry_at = time.monotonic() + self._rotate_delay
        log.warning(
            "queue %s: could not start log %d (%s); staying on log %d, next try in %.2f s",
            self.name,
            no,
            exc,
            current,
            self._rotate_delay,
        )

    def rotation_started(self) -> None:
        """The next log exists: the rotation is no longer asked for."""
        self.rotate_requested = False
        self._rotate_delay = 0.0

    def rotated(self, path: str, no: int) -> tuple[str, MemSegment]:
        """The log at ``path`` is closed and log ``no`` takes the writes: rename the old
        one ``.log_ro`` and start a new in-memory segment; the frozen log and its
        in-memory segment, for the freeze."""
        ro = path + "_ro"
        try:
            fileio.rename(path, ro)
        except OSError as exc:  # recovery reads a closed ``.log`` the same way
            log.warning(
                "queue %s: could not rename %s (%s); freezing it as is", self.name, path, exc
            )
            ro = path
        frozen = self.memseg
        self.memseg = MemSegment(no)
        self.frozen.append((ro, frozen))
        self.view.memsegs = self.memsegs()
        return ro, frozen

    def warn_stalled(self, fill: int) -> None:
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
            fill,
            len(self.frozen),
            "a freeze is failing and retried"
            if self._freeze_delay
            else "the compaction worker has not finished them",
        )

    # ------------------------------------------------------------------ freezing

    def is_frozen(self, mem: MemSegment) -> bool:
        """``mem`` still waits for its segment file."""
        return any(m is mem for _, m in self.frozen)

    def install_frozen(
        self, path: str, mem: MemSegment, result: FreezeResult, cursor: bytes
    ) -> None:
        """Swap the segment file the freeze of ``path`` wrote in for ``mem``.

        The ``.log_ro`` is deleted (and the deletion synced) *before* the segment joins
        the set merges may read: so a merge output never covers a log that still exists.
        Raises if that fails (the freeze is retried, ``freeze_failed``)."""
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
        self.view.memsegs = self.memsegs()
        if reader is not None:
            self.segments.append(reader)
            self.segments.sort(key=lambda r: r.seg_lo)
            self.view.add_segment(reader, cursor)
        mem.replaced_by = reader

    def freeze_failed(self, path: str, exc: BaseException) -> float:
        """Count a failed freeze (disk full, descriptors, a killed worker); the seconds
        to wait before trying it again. The log stays in memory and on disk meanwhile."""
        self.freeze_failures += 1
        delay = backoff(self._freeze_delay.get(path, 0.0))
        self._freeze_delay[path] = delay
        log.error(
            "queue %s: freezing %s failed (%s); retrying in %.2f s", self.name, path, exc, delay
        )
        self.merge_error = exc
        return delay

    def frozen_result(self, mem: MemSegment) -> FreezeResult:
        """What a freeze of ``mem``'s log wrote, when the log is gone: an earlier attempt
        wrote the segment file and deleted the log, then failed to sync the directory."""
        no = mem.segment_no
        seg = os.path.join(self.directory, segment_name(no, no))
        return FreezeResult(no, seg if os.path.exists(seg) else None)

    def unfrozen_logs(self) -> list[int]:
        """Numbers of logs that have no segment file yet."""
        return [m.segment_no for _, m in self.frozen] + [self.memseg.segment_no]

    # ------------------------------------------------------------------ merging

    def descriptions(self) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        return [
            SegmentDesc(
                r.seg_lo, r.seg_hi, r.info.pending_count, r.info.tombstone_count, r.file_size
            )
            for r in self.segments
        ]

    def merge_backing_off(self) -> bool:
        """A failed merge still waits before the next one may start."""
        return time.monotonic() < self._merge_retry_at

    def start_merge(self, start: int, stop: int) -> tuple[list[SegmentReader], bool] | None:
        """Take ``segments[start:stop]`` (a contiguous range) for a merge: the inputs,
        and whether rogue tombstones may be dropped; None if the range is empty.

        Tombstones whose pending entry is outside the range are kept (rogue), unless
        the range starts at the oldest segment and no older log is waiting for its
        segment file, where nothing older could need them. A range whose log numbers
        span a log that has no segment file yet is refused: the output's name would
        claim that log, and recovery would take the claim for a fact."""
        if self.merging:
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
        self.merging = True
        return inputs, start == 0 and all(n > hi for n in unfrozen)

    def merge_stopped(self) -> None:
        """The merge ended without an output (the queue is closing): its inputs stay."""
        self.merging = False

    def merge_finished(self) -> None:
        """The merge wrote its output (installed next, unless the queue closed)."""
        self.merging = False
        self._merge_delay = 0.0

    def merge_failed(self) -> float:
        """The merge failed: the seconds the policy waits before it tries again. A merge
        is only housekeeping, and one that failed (a full disk, a killed worker) would
        fail again at once: the policy would restart it at every maintenance tick,
        rereading every input and logging an error twice a second for as long as the
        disk stays full. Wait 1 s, doubling to 60 s."""
        self.merging = False
        self._merge_delay = min(max(self._merge_delay * 2, 1.0), 60.0)
        self._merge_retry_at = time.monotonic() + self._merge_delay
        return self._merge_delay

    def install_merge(self, inputs: list[SegmentReader], path: str | None, cursor: bytes) -> None:
        """Swap the merge's output in for its inputs (deleted, and the deletion synced)."""
        reader = SegmentReader(path) if path else None
        self.view.remove_segments(inputs)
        gone = {id(r) for r in inputs}
        self.segments = [r for r in self.segments if id(r) not in gone]
        if reader is not None:
            self.segments.append(reader)
            self.segments.sort(key=lambda r: r.seg_lo)
            self.view.add_segment(reader, cursor)
        for r in inputs:
            r.replaced_by = reader
            if r.path != path:
                fileio.remove(r.path)
            r.close()
        fileio.fsync_dir(self.directory)

    # ------------------------------------------------------------------ copies

    def copy_into(self, dest: str, live: WalWriter | None) -> None:
        """Copy the queue's directory into ``dest`` (a follower's copy): hard-link the
        immutable files, copy the rest, the live log ``live`` as appended so far (with
        its buffer; call under its ``io_lock``). Torn tails are left out."""
        live_log = None if live is None else live.path
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(_SKIPPED_SUFFIXES) or ".torn-" in name:
                continue
            src = os.path.join(self.directory, name)
            if not os.path.isfile(src):
                continue
            target = os.path.join(dest, name)
            if live is not None and src == live_log:
                live.copy_to(target)
            elif name.endswith((".json", ".log")):
                shutil.copyfile(src, target)  # rewritten in place, or by rename: copy
            else:
                os.link(src, target)  # segment files, closed logs, sidecars: immutable
