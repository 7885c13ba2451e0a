"""A queue's part in following a replica group (``docs/replication.md``).

A follower appends the leader's records to its own log exactly as the leader framed
them, through the same group commit as any write (``Queue.apply_record`` submits them),
so its files are the leader's, record for record. Here is what turns one record into
the batch that does it: its metadata entries set apart from its entries (read as
recovery reads them, tombstones kept: a follower has no cursor), the items' groups
taken from the metadata, and the id counter moved past the highest id seen, so after a
failover the ids a new leader gives keep rising.

It is given the parts it reads — ``GroupCommit`` (the id counter) and ``SegmentSet``
(the in-memory segment the batch publishes into); ``read`` runs without the queue's
lock (it touches no state), ``batch`` under it, and nothing here calls the queue.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from dq.storage.codec import iter_entries, key_id
from dq.storage.group_commit import GroupCommit, PendingBatch
from dq.storage.itemmeta import groups_of
from dq.storage.replication import KIND_RECORD_WITH_META
from dq.storage.wal import split_meta

if TYPE_CHECKING:
    from dq.storage.segment_set import SegmentSet

__all__ = ["Record", "ReplicaFollower"]


@dataclass(slots=True)
class Record:
    """One of the leader's records, read: its entries as framed, each one parsed, and
    its metadata entries (empty: none)."""

    entries: bytes
    parsed: list[tuple[bytes, bytes | None, bytes | None]]
    meta: bytes
    #: where it came from, for the errors that name it
    where: str


class ReplicaFollower:
    """One queue's side of following a replica group (see the module docstring)."""

    def __init__(self, name: str, commit: GroupCommit, files: SegmentSet) -> None:
        self.name = name
        self.commit = commit
        self.files = files

    def read(self, kind: int, body: bytes) -> Record:
        """Parse one of the leader's records (``kind``: with metadata entries or not);
        a damaged one raises ``CorruptionError``. Needs no lock."""
        meta, entries = split_meta(body) if kind == KIND_RECORD_WITH_META else (b"", body)
        where = f"replicated record of queue {self.name}"
        parsed = [(k, s, v) for k, s, v, _off in iter_entries(entries, where=where)]
        return Record(entries, parsed, meta, where)

    def batch(self, record: Record) -> PendingBatch:
        """The batch that appends ``record`` and publishes its entries as recovery
        would load them, with their groups; the id counter moves past its highest id.
        Call under the lock, the queue checked open."""
        parsed = record.parsed
        if parsed:
            commit = self.commit
            commit.next_id = max(commit.next_id, max(key_id(k) for k, _, _ in parsed) + 1)
        grouped = groups_of(record.meta, record.where) if record.meta else {}
        return PendingBatch(
            self.files.memseg,
            None,
            entries=parsed,
            load_meta=record.meta,
            wakes=True,
            groups={k: grouped[key_id(k)] for k, s, _v in parsed if s and key_id(k) in grouped}
            or None,
        )
