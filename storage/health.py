"""A queue's health: whether it takes work, and why not (an I/O error, damage found on
disk, closed), and when it next tries to reopen from disk.

What this owns: ``loaded`` (its memory holds its directory and a log is open),
``failed`` (the error every operation answers while it is set), ``quarantined``
(damage: it stays failed until an operator repairs the queue and restarts), ``closed``,
the backoff of reopening, and the counters ``stats`` shows. What failing and reopening
mean for the other parts is done elsewhere (``storage/failing.py``: refuse the waiting
batches, cut the log back; ``Queue.check_open``: reload from disk).

Invariant: a queue that fails again within ``RECOVERY_GRACE_S`` of reopening keeps
backing off, so a fault that has not cleared (a full disk) does not reopen the queue,
and start a new log, at every request.
"""

from __future__ import annotations

import logging
import time

from dq.storage.errors import CorruptionError, EngineUnavailable, QueueDamaged, StorageError

__all__ = ["RECOVERY_GRACE_S", "Health", "backoff"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs

#: A queue that fails again within this long after a reopen keeps backing off.
RECOVERY_GRACE_S = 1.0


def backoff(previous: float) -> float:
    """The next retry delay: 50 ms, doubling, at most 5 s."""
    return min(max(previous * 2, 0.05), 5.0)


class Health:
    """One queue's failure state; every method runs under the queue's lock."""

    def __init__(self, name: str, directory: str) -> None:
        self.name = name
        self.directory = directory
        #: the queue's memory holds its directory and a log is open (False until it
        #: opens, and from a reopen's start until it succeeds)
        self.loaded = False
        #: the queue was closed (deleted, or the engine stops): it takes nothing more
        self.closed = False
        #: why the queue refuses work (an I/O error, or damage found when opening it)
        self.failed: StorageError | None = None
        #: damaged on disk: stays failed until an operator repairs it and restarts
        self.quarantined = False
        self._recover_delay = 0.0
        self._recover_at = 0.0
        #: when the queue last reopened after a failure (``time.monotonic``)
        self._recovered_at = -1e9
        #: failures of a write or sync, and reopenings from disk (``stats().extra``)
        self.io_errors = 0
        self.recoveries = 0

    def quarantine(self, exc: CorruptionError) -> None:
        """The queue is damaged where ``exc`` says: it refuses everything, for good."""
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

    def refusal(self, exc: BaseException, what: str) -> BaseException:
        """What a write refused because ``what`` failed with ``exc`` is answered."""
        if isinstance(exc, StorageError):
            return exc
        return EngineUnavailable(f"{what} failed: {exc}", queue=self.name)

    def fail(self, exc: BaseException, what: str) -> None:
        """A write or sync failed: refuse work until the queue is reopened from disk.
        The first failure counts; a queue already failed stays as it is."""
        if self.failed is not None:
            return
        self.io_errors += 1
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

    def recovery_due(self) -> bool:
        """Failed (not damaged), and the next try at reopening is due."""
        if self.failed is None or self.quarantined:
            return False
        return time.monotonic() >= self._recover_at

    def reopen_failed(self, exc: BaseException) -> None:
        """Reopening from disk failed: back off before the next try."""
        self._recover_delay = backoff(self._recover_delay)
        self._recover_at = time.monotonic() + self._recover_delay
        log.warning(
            "queue %s: still failed; reopening from disk failed (%s), next try in %.2f s",
            self.name,
            exc,
            self._recover_delay,
        )

    def reopened(self) -> None:
        """The queue reopened from disk: it takes work again."""
        log.warning("queue %s: reopened from disk after: %s", self.name, self.failed)
        self._recovered_at = time.monotonic()
        self.failed = None
        self.recoveries += 1
