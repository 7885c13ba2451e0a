"""A queue's part in a replica group: applying a leader's records on a follower, and
copying the queue for a follower that (re)joins.

Applying: a follower appends the leader's record to its own log exactly as the leader
framed it, through the same group commit as any write, and publishes its entries once
synced, as recovery would load them (tombstones kept: the follower has no cursor).
Its id counter follows the highest id seen, so after a failover ids keep rising.

Copying (``snapshot_into``): under the queue's lock and its log's ``io_lock`` the set
of files is a crash-consistent state with every shipped record in it: immutable files
are hard-linked, the live log is copied with its unwritten buffer. The copy notes the
lsn of the last record it holds, so the follower skips those records in the stream.
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import os
import shutil
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.storage.codec import iter_entries, key_id
from dq.storage.group_commit import PendingBatch
from dq.storage.queue_core import QueueCore
from dq.storage.replication import KIND_RECORD_WITH_META
from dq.storage.wal import split_meta

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["ReplicaMixin"]

#: files a copy leaves out: half-written outputs, merge-cancel markers, torn tails
_SKIPPED_SUFFIXES = (".tmp", ".cancel")


class ReplicaMixin(QueueCore):
    """Applying replicated records and copying the queue for a follower."""

    def apply_record(self: Queue, kind: int, body: bytes) -> Future[Any]:
        """Append one of the leader's records; resolved (None) once it is durable."""
        meta, entries = split_meta(body) if kind == KIND_RECORD_WITH_META else (b"", body)
        where = f"replicated record of queue {self.name}"
        parsed = [(k, s, v) for k, s, v, _off in iter_entries(entries, where=where)]
        with self.lock:
            self.check_open()
            if self.stalled():  # never refused (the stream must go on): just press on
                self.retry_rotation()
            if parsed:
                self.next_id = max(self.next_id, max(key_id(k) for k, _, _ in parsed) + 1)
            batch = PendingBatch(
                self.files.memseg, None, entries=parsed, load_meta=meta, wakes=True
            )
            return self._submit(batch, entries, meta)

    def snapshot_into(self: Queue, dest: str) -> int:
        """Copy this queue's files into the empty directory ``dest``; return the lsn of
        the last record the copy holds (0 if none was shipped)."""
        with self.lock:
            if self.health.quarantined:
                # damaged: copied as it lies on disk, so a follower quarantines it the
                # same way (its other queues still join) and every member keeps what an
                # operator may repair; it takes no writes, so the stream has none of it
                self._copy_files(dest, None)
                return self.last_lsn
            self.check_open()
            wal = self.commit.wal
            with wal.io_lock:
                self._copy_files(dest, wal.path)
            return self.last_lsn

    def _copy_files(self: Queue, dest: str, live_log: str | None) -> None:
        """Hard-link the immutable files, copy the rest (the live log with its buffer)."""
        for name in sorted(os.listdir(self.directory)):
            if name.endswith(_SKIPPED_SUFFIXES) or ".torn-" in name:
                continue
            src = os.path.join(self.directory, name)
            if not os.path.isfile(src):
                continue
            target = os.path.join(dest, name)
            if src == live_log:
                self.commit.wal.copy_to(target)
            elif name.endswith((".json", ".log")):
                shutil.copyfile(src, target)  # rewritten in place, or by rename: copy
            else:
                os.link(src, target)  # segment files, closed logs, sidecars: immutable
