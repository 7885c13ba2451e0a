"""A queue's failure and recovery state: failing after an I/O error, quarantine after
damage, and reopening from disk once the fault clears.

Invariant: after a failed write or sync nothing more is acknowledged: every waiting
batch is refused and rolled back, and the log is cut back to exactly what was
acknowledged (and synced) before anyone hears "refused", so a refused operation can
never come back after a crash. A damaged queue stays quarantined until an operator
repairs it; a failed one is reopened from disk with a backoff (the restart path).
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from dq.storage.errors import (
    CorruptionError,
    EngineUnavailable,
    QueueDamaged,
    ReplicationTimeout,
    StorageError,
)
from dq.storage.futures import Answer
from dq.storage.queue_core import QueueCore
from dq.storage.segment_set import backoff

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["FailureMixin"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


#: A queue that fails again within this long after a reopen keeps backing off.
RECOVERY_GRACE_S = 1.0


class FailureMixin(QueueCore):
    """Failing, quarantining and reopening a queue."""

    def _quarantine(self: Queue, exc: CorruptionError) -> None:
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

    def _fail_locked(self: Queue, exc: BaseException, what: str) -> list[Answer]:
        """Fail the queue after a write or sync error (call under the lock).

        After a failed write or fsync the page cache cannot be trusted to say what is
        on disk, so nothing more is acknowledged: every waiting batch is refused and
        rolled back, records still buffered are discarded (a refused operation must
        never happen later), and the queue refuses work until it is reopened from disk.
        On a replica group's leader a batch already shipped is answered "unknown"
        (``ReplicationTimeout``), not refused: the followers may hold it, and a member
        that takes over makes it visible.
        """
        error: BaseException = (
            exc
            if isinstance(exc, StorageError)
            else EngineUnavailable(f"{what} failed: {exc}", queue=self.name)
        )
        if self.failed is None and self.engine.replication is not None:
            # a leader's log may now hold records its followers do not: step down
            self.engine.replication.local_failure(self.name, error)
        if self.failed is None:
            self.counters["io_errors"] += 1
            self.failed = EngineUnavailable(
                f"queue failed: {what}: {exc}; it is reopened from disk once the fault clears",
                queue=self.name,
            )
            self.failed.__cause__ = exc
            now = time.monotonic()
            if now - self._recovered_at < RECOVERY_GRACE_S:
                # failed again right after a reopen: the fault has not cleared. Back off
                # as a failed reopen does; each reopen starts a new log, and reopening
                # at once on a full disk would leave a new log file per request.
                self._recover_delay = backoff(self._recover_delay)
            else:
                self._recover_delay = 0.0
            self._recover_at = now + self._recover_delay
            log.error(
                "queue %s: %s failed: %s; the queue refuses work until reopened",
                self.name,
                what,
                exc,
            )
        if self.loaded:
            self.commit.wal.discard_buffer()
            try:  # before anyone hears "refused": a crash now must not bring it back
                self.commit.cut_back()
            except Exception as cut_exc:  # tried again when the queue reopens
                log.error("queue %s: cutting the log back failed: %s", self.name, cut_exc)
        answers: list[Answer] = []
        in_doubt: BaseException | None = None
        for batch in reversed(self.commit.refuse_all()):
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

    def recover_if_due(self: Queue) -> None:
        """Reopen a failed queue from disk when its retry is due (the restart path)."""
        with self.lock:
            self._recover_locked()

    def _recover_locked(self: Queue) -> None:
        if self.failed is None or self.quarantined or self.closed:
            return
        if time.monotonic() < self._recover_at or self.files.merging:
            return
        try:
            if self.loaded:
                self.commit.cut_back()
            self.files.drop()
            self.loaded = False
            self._load()
        except CorruptionError as exc:
            self._quarantine(exc)
            return
        except Exception as exc:
            self._recover_delay = backoff(self._recover_delay)
            self._recover_at = time.monotonic() + self._recover_delay
            log.warning(
                "queue %s: still failed; reopening from disk failed (%s), next try in %.2f s",
                self.name,
                exc,
                self._recover_delay,
            )
            return
        log.warning("queue %s: reopened from disk after: %s", self.name, self.failed)
        self._recovered_at = time.monotonic()
        self.failed = None
        self.counters["recoveries"] += 1

    # ------------------------------------------------------------------ the open check

    def check_open(self: Queue) -> None:
        if self.failed is not None:
            self._recover_locked()
        if self.failed is not None:
            raise self.failed
        if self.closed:
            raise EngineUnavailable("queue is closed", queue=self.name)
