"""A queue's part in leading a replica group (``docs/replication.md``).

On a leader every record the queue appends is shipped to the replicator, which numbers
it (its lsn, ``GroupCommit.append``), and the write waits, synced, until the sync set
holds it (``Queue.publish_committed`` publishes it then). What the replica engine asks
of one queue while it leads is here: the lsn of the last record shipped, whether a write
waits for the commit, letting every waiting write go when the node stops shipping to
the sink that numbered it, and the copy of the queue's files a follower that (re)joins
starts from.

Invariant: a write let go here (``drop_replicated``) is undone in memory before anyone
is answered, as any refused write (``Failing.roll_back``); its record stays in the log,
since a node that stops leading replaces its queues with the leader's copy.

It is given the parts it reads — ``GroupCommit`` (the waiting writes, the log, the last
lsn), ``SegmentSet`` (the files copied), ``Health`` (a damaged queue is copied as it
lies) and ``Failing`` (rolling a write back); every method runs under the queue's lock
(``awaits_commit``, a hint, without it), and nothing here calls the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dq.storage.failing import Failing
    from dq.storage.futures import Answer
    from dq.storage.group_commit import GroupCommit
    from dq.storage.health import Health
    from dq.storage.segment_set import SegmentSet

__all__ = ["ReplicaLeader"]


class ReplicaLeader:
    """One queue's side of leading a replica group (see the module docstring)."""

    def __init__(
        self, commit: GroupCommit, files: SegmentSet, health: Health, failing: Failing
    ) -> None:
        self.commit = commit
        self.files = files
        self.health = health
        self.failing = failing

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

    def drop_replicated(self, error: BaseException) -> list[Answer]:
        """Forget every waiting replicated batch (the sink that numbered it is gone):
        undo what it held in memory and answer ``error``; the next record shipped is
        numbered by the next sink. Its record stays in the log; a node that stops
        leading replaces its queues with the leader's copy. Settle the answers once the
        lock is let go."""
        out: list[Answer] = []
        for batch in self.commit.refuse_replicated():
            self.failing.roll_back(batch)
            out.append((batch.future, None, error))
        return out

    def copy_into(self, dest: str) -> int:
        """Copy the queue's files into the empty directory ``dest`` for a follower that
        (re)joins (the queue checked open, unless damaged); return the lsn of the last
        record the copy holds (0 if none was shipped). Under the queue's lock and the
        log's ``io_lock`` the files are a crash-consistent state with every shipped
        record in it."""
        if self.health.quarantined:
            # damaged: copied as it lies on disk, so a follower quarantines it the
            # same way (its other queues still join) and every member keeps what an
            # operator may repair; it takes no writes, so the stream has none of it
            self.files.copy_into(dest, None)
            return self.last_lsn
        wal = self.commit.wal
        with wal.io_lock:
            self.files.copy_into(dest, wal)
        return self.last_lsn
