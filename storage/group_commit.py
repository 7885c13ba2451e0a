"""Group commit: a queue's log, the batches appended to it that wait to be durable, and
the barrier of batches not published yet.

What this owns: the queue's current ``WalWriter``; ``next_id``, the id the next item
gets (a record carries its items' ids, and each new log's header the counter, so ids
are never reused even if a log is lost); ``waiting``, the batches appended
in ``always`` mode that wait for a sync round (and, on a replica group's leader, for the
group's commit); the barrier (``hold``/``unhold``): the smallest key of each batch not
published yet, which dequeue does not pass; the sync round's write and ``fdatasync``;
cutting the log back after a failure. It never touches the in-memory segments: a
batch is data (``PendingBatch``), and the queue publishes the batches this part says
are ready (``Queue._publish``), in order.

Invariant: a batch is ready only once its record is durable per the fsync mode and, on
a leader, the sync set has it too (``docs/replication.md``); batches become ready in
the order they were appended, so they publish in that order. A refused batch never
becomes ready.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from dq.storage.errors import ReplicationStalled, ReplicationTimeout
from dq.storage.futures import Answer
from dq.storage.wal import WalWriter, record_body
from dq.storage.write_future import WriteFuture

if TYPE_CHECKING:
    from dq.storage._leases import Lease
    from dq.storage.config import EngineConfig
    from dq.storage.itemmeta import Remembered
    from dq.storage.memseg import MemSegment
    from dq.storage.replication import ReplicationSink
    from dq.storage.syncer import FsyncStats

__all__ = ["CommitHost", "GroupCommit", "PendingBatch"]


class CommitHost(Protocol):
    """What group commit needs from the engine: its fsync mode, the replica group's
    sink and commit lsn, and the fsync latency histogram."""

    config: EngineConfig
    replication: ReplicationSink | None
    commit_lsn: int
    fsync_stats: FsyncStats


class PendingBatch:
    """One log record from its append until it is published: what it makes visible once
    durable, what to give back if it is refused, whom to answer.

    Plain data, applied by ``Queue._publish`` (and undone by ``Failing.roll_back``):
    ``keyed`` pending entries (key, value) that all carry ``stats``; ``entries`` as
    (key, stats, value), stats and value None for a tombstone kept in memory; ``behind``
    tombstones of delivered entries (counted, not kept); ``remembered`` idempotency keys
    that stop waiting once published; ``load_meta`` item metadata to load (a
    replicated record's); ``groups`` the groups of its grouped pending entries (key ->
    group, ``docs/delivery.md``); ``token`` the barrier it holds; ``restore`` the leases
    it ends, which a refusal gives back (their slots are freed when it is published,
    ``storage/_delivery.c``); ``unheld`` the held items it removes, held again if it
    is refused; ``wakes``: publishing it makes entries due (watchers are told).
    """

    __slots__ = (
        "behind",
        "deadline",
        "entries",
        "future",
        "groups",
        "keyed",
        "load_meta",
        "lsn",
        "mem",
        "remembered",
        "restore",
        "result",
        "seq",
        "stats",
        "synced",
        "token",
        "unheld",
        "wakes",
        "wal",
    )

    def __init__(
        self,
        mem: MemSegment,
        result: Any,
        *,
        keyed: list[tuple[bytes, bytes]] | None = None,
        stats: bytes = b"",
        entries: Sequence[tuple[bytes, bytes | None, bytes | None]] | None = None,
        behind: int = 0,
        token: int = 0,
        restore: list[tuple[int, Lease]] | None = None,
        remembered: list[Remembered] | None = None,
        load_meta: bytes = b"",
        wakes: bool = False,
        groups: dict[bytes, str] | None = None,
        unheld: list[tuple[bytes, str | None, int]] | None = None,
    ) -> None:
        self.mem = mem
        self.groups = groups
        self.unheld = unheld
        self.result = result
        self.keyed = keyed
        self.stats = stats
        self.entries = entries
        self.behind = behind
        self.token = token
        self.restore = restore
        self.remembered = remembered
        self.load_meta = load_meta
        self.wakes = wakes
        self.future: WriteFuture[Any] = WriteFuture()
        self.wal: WalWriter | None = None
        self.seq = 0
        #: replication sequence number (0: not replicated)
        self.lsn = 0
        #: when a replicated write stops waiting for its sync set (monotonic seconds)
        self.deadline = 0.0
        self.synced = False


class GroupCommit:
    """A queue's log and the batches waiting on it; every method runs under the queue's
    lock except ``write_round``."""

    def __init__(self, name: str, host: CommitHost) -> None:
        self.name = name
        self.host = host
        #: the current log (set when the queue loads or rotates)
        self.wal: WalWriter
        #: the id the next item gets; every id below it was given
        self.next_id = 1
        #: batches appended in ``always`` mode, in append order, not published yet
        self.waiting: list[PendingBatch] = []
        self._unpublished: dict[int, bytes] = {}
        self._token = 0
        self.last_write = time.monotonic()
        #: the lsn of the last record shipped to followers (a leader's snapshot notes it)
        self.last_lsn = 0
        #: the log was cut back after a failure (once per failure)
        self._cut = False

    def start(self, wal: WalWriter) -> None:
        """Write to ``wal`` from now on, with no barrier held (the queue (re)loaded)."""
        self.wal = wal
        self._unpublished.clear()
        self._cut = False

    # ------------------------------------------------------------------ the barrier

    def hold(self, key: bytes) -> int:
        """Bar dequeue from passing ``key`` until ``unhold(token)``; returns the token."""
        self._token += 1
        self._unpublished[self._token] = key
        return self._token

    def unhold(self, token: int) -> None:
        self._unpublished.pop(token, None)

    def barrier(self) -> bytes | None:
        """The smallest key of a batch not published yet: dequeue stops before it."""
        unpublished = self._unpublished
        return min(unpublished.values()) if unpublished else None

    # ------------------------------------------------------------------ appending

    def append(self, batch: PendingBatch, payload: bytes, meta: bytes = b"") -> None:
        """Frame ``batch``'s record into the log's buffer (no I/O) and, on a replica
        group's leader, ship it. In ``always`` mode the batch then waits for a sync
        round. ``ReplicationStalled``: refused before anything was written."""
        sink = self.host.replication
        if sink is not None and not sink.admits_writes():
            raise ReplicationStalled(
                "the replica group's sync set has acknowledged nothing for a commit timeout; "
                "the write was refused before anything was written: retry later",
                queue=self.name,
            )
        wal = batch.wal = self.wal
        batch.seq = wal.append(payload, meta)
        self.last_write = now = time.monotonic()
        if sink is not None:  # a leader: the followers get the record as appended
            kind, body = record_body(payload, meta)
            batch.lsn = self.last_lsn = sink.ship(self.name, kind, body)
            batch.deadline = now + sink.commit_timeout_s
        if self.host.config.fsync == "always":
            self.waiting.append(batch)

    def write_now(self) -> None:
        """Write what is buffered at once (``interval`` and ``never`` modes)."""
        wal = self.wal
        data, _seq = wal.take_buffer()
        with wal.io_lock:
            wal.write(data)

    # ------------------------------------------------------------------ sync rounds

    def take_round(self) -> tuple[WalWriter, bytes, int]:
        """Detach the log's buffer for ``write_round``. The log's ``io_lock`` is taken
        here, before the queue lock is let go, so no one can close the log between
        taking its buffer and writing it; ``write_round`` lets it go."""
        wal = self.wal
        data, seq = wal.take_buffer()
        wal.io_lock.acquire()
        return wal, data, seq

    def write_round(self, wal: WalWriter, data: bytes) -> BaseException | None:
        """Write and (unless fsync is ``never``) sync ``data``, without the queue lock;
        the error, if any."""
        try:
            if self.host.config.fsync == "never":
                wal.write(data)
            else:  # the latency observed includes the write (to the page cache)
                t0 = time.perf_counter()
                wal.write_and_sync(data)
                self.host.fsync_stats.observe(time.perf_counter() - t0)
        except BaseException as exc:
            return exc
        finally:
            wal.io_lock.release()
        return None

    def synced(self, wal: WalWriter, seq: int) -> list[PendingBatch]:
        """``wal`` is synced up to ``seq``: the batches now ready to publish (``ready``'s
        rule, taken in the same pass that marks them: a round's one call for this)."""
        commit = self.host.commit_lsn
        waiting = self.waiting
        n = 0
        ready = True
        for batch in waiting:
            if batch.wal is wal and batch.seq <= seq:
                batch.synced = True
            if ready:
                if batch.synced and batch.lsn <= commit:
                    n += 1
                else:
                    ready = False
        if not n:
            return []
        self.waiting = waiting[n:]
        return waiting[:n]

    def ready(self) -> list[PendingBatch]:
        """Take, in append order, every waiting batch that is synced and committed
        (``lsn`` 0 is not replicated); stop at the first that is not."""
        commit = self.host.commit_lsn
        waiting = self.waiting
        n = 0
        for batch in waiting:
            if not batch.synced or batch.lsn > commit:
                break
            n += 1
        if not n:
            return []
        self.waiting = waiting[n:]
        return waiting[:n]

    # ------------------------------------------------------------------ refusals

    def refuse_all(self) -> list[PendingBatch]:
        """Take every waiting batch, in append order (a failed write or sync, or the
        queue closing: none of them will be published)."""
        refused, self.waiting = self.waiting, []
        return refused

    def refuse_replicated(self) -> list[PendingBatch]:
        """Take every waiting replicated batch (the sink that numbered it is gone); the
        next record shipped is numbered by the next sink."""
        self.last_lsn = 0
        keep: list[PendingBatch] = []
        out: list[PendingBatch] = []
        for batch in self.waiting:
            (out if batch.lsn else keep).append(batch)
        self.waiting = keep
        return out

    def overdue(self, now: float) -> list[Answer]:
        """Answer ``ReplicationTimeout`` to replicated writes that waited too long for
        the sync set. They stay waiting: if they commit later they still publish."""
        out: list[Answer] = []
        for batch in self.waiting:
            if batch.lsn and batch.deadline <= now and not batch.future.done():
                out.append(
                    (
                        batch.future,
                        None,
                        ReplicationTimeout(
                            "the replica group's sync set did not acknowledge the write in "
                            "time; its outcome is unknown (it may still become visible)",
                            queue=self.name,
                        ),
                    )
                )
        return out

    def cut_back(self) -> None:
        """Cut the log back to exactly what was acknowledged — synced bytes in
        ``always``, written bytes otherwise; what lies beyond belongs to refused
        batches — and sync it. Once per failure."""
        if self._cut:
            return
        wal = self.wal
        keep = wal.synced_offset if self.host.config.fsync == "always" else wal.offset
        wal.cut_back(keep)
        self._cut = True
