"""Refusing writes: one batch rolled back, or the whole queue failed after an I/O error.

After a failed write or fsync the page cache cannot be trusted to say what is on disk,
so nothing more is acknowledged (``fail``): every waiting batch is refused and rolled
back, records still buffered are discarded (a refused operation must never happen
later), the log is cut back to what was acknowledged, and the queue refuses work until
it is reopened from disk (``Health``; ``Queue.check_open`` reopens it). A batch refused
alone (a replica group that takes no write) is rolled back the same way
(``roll_back``).

It is given the parts it touches: ``GroupCommit`` (the buffer, the waiting batches,
the barrier), ``Deliveries`` (the leases and held items a refused batch gives back) and ``Health``;
every method runs under the queue's lock. Both the queue's operations and its file
jobs (a rotation whose log cannot be closed, ``storage/file_jobs.py``) fail it here.

Invariant: a refused batch never becomes visible, and holds nothing once refused (its
barrier lifted, its leases given back, the held items it removed held again), before
anyone is answered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol

from dq.storage.errors import ReplicationTimeout
from dq.storage.futures import Answer

if TYPE_CHECKING:
    from dq.storage.deliveries import Deliveries
    from dq.storage.group_commit import GroupCommit, PendingBatch
    from dq.storage.health import Health
    from dq.storage.replication import ReplicationSink

__all__ = ["Failing", "FailingHost"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class FailingHost(Protocol):
    """What failing needs from the engine: a replica group leader's replicator, and the
    clock (held items are held again as of now)."""

    replication: ReplicationSink | None

    def now(self) -> int: ...


class Failing:
    """Refusals of one queue's writes; every method runs under the queue's lock."""

    def __init__(
        self,
        name: str,
        host: FailingHost,
        commit: GroupCommit,
        deliveries: Deliveries,
        health: Health,
    ) -> None:
        self.name = name
        self.host = host
        self.commit = commit
        self.deliveries = deliveries
        self.health = health

    def roll_back(self, batch: PendingBatch) -> None:
        """Undo what a refused batch held in memory: its barrier, the leases it took
        (their slots were never freed), the held items it removed."""
        if batch.token:
            self.commit.unhold(batch.token)
        if batch.restore is not None:
            self.deliveries.give_back(batch.restore)
        if batch.unheld:
            self.deliveries.index.put_back(batch.unheld, self.host.now())

    def fail(self, exc: BaseException, what: str) -> list[Answer]:
        """Fail the queue after a write or sync error; the answers of the waiting
        batches (settle them once the lock is let go).

        On a replica group's leader a batch already shipped is answered "unknown"
        (``ReplicationTimeout``), not refused: the followers may hold it, and a member
        that takes over makes it visible.
        """
        health, commit = self.health, self.commit
        error = health.refusal(exc, what)
        sink = self.host.replication
        if health.failed is None and sink is not None:
            # a leader's log may now hold records its followers do not: step down
            sink.local_failure(self.name, error)
        health.fail(exc, what)
        if health.loaded:
            commit.wal.discard_buffer()
            try:  # before anyone hears "refused": a crash now must not bring it back
                commit.cut_back()
            except Exception as cut_exc:  # tried again when the queue reopens
                log.error("queue %s: cutting the log back failed: %s", self.name, cut_exc)
        answers: list[Answer] = []
        in_doubt: BaseException | None = None
        for batch in reversed(commit.refuse_all()):
            self.roll_back(batch)
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
