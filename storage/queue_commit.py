"""Group commit: appending a batch's record to the log and answering it once durable.

What this owns: ``PendingBatch`` (one appended record waiting for its sync: what to
publish, what to undo, whom to answer), ``answer`` (futures are settled outside the
queue lock), and the queue's ``_submit`` / ``_complete`` / ``sync_round``.

Invariant: a batch is published into the in-memory segment, and its future resolved,
only once its record is durable per the fsync mode (``always``: after the syncer's
sync round; otherwise once written) and, on a replica group's leader, once the group's
sync set has it too (``Engine.commit``; ``docs/replication.md``). Batches publish in
the order they were appended. Until then its smallest key is held in
``_unpublished`` (``_hold``), a barrier dequeue does not pass. A refused batch is
rolled back and never published.
"""

# mypy: disable-error-code="misc"
# The methods take ``self: Queue``: they are ``Queue``'s own, kept here by job. mypy
# calls that self-type "not a supertype" of the mixin (the "misc" code turned off above).

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.storage.errors import ReplicationStalled, ReplicationTimeout, StorageError
from dq.storage.futures import settle
from dq.storage.queue_core import QueueCore
from dq.storage.wal import WalWriter, record_body
from dq.storage.write_future import WriteFuture

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["Answer", "CommitMixin", "PendingBatch", "answer"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class PendingBatch:
    """One appended record waiting for its sync (``always`` mode): what to publish once
    it is durable, what to undo if it is refused, and whom to answer. On a replica
    group's leader it also carries its lsn: it publishes once synced *and* committed."""

    __slots__ = (
        "deadline",
        "future",
        "lsn",
        "publish",
        "result",
        "rollback",
        "seq",
        "synced",
        "wal",
    )

    def __init__(
        self,
        wal: WalWriter,
        seq: int,
        publish: Callable[[], None],
        rollback: Callable[[], None] | None,
        future: Future[Any],
        result: Any,
        lsn: int = 0,
        deadline: float = 0.0,
    ) -> None:
        self.wal = wal
        self.seq = seq
        self.publish = publish
        self.rollback = rollback
        self.future = future
        self.result = result
        #: replication sequence number (0: not replicated)
        self.lsn = lsn
        #: when a replicated write stops waiting for its sync set (monotonic seconds)
        self.deadline = deadline
        self.synced = False


#: (future, result, error): settled outside the queue lock by ``answer``
Answer = tuple["Future[Any]", Any, BaseException | None]


def answer(answers: list[Answer]) -> None:
    for fut, result, error in answers:
        settle(fut, result, error)


class CommitMixin(QueueCore):
    """The queue's write path into its log (group commit)."""

    def hold(self: Queue, key: bytes) -> int:
        """Bar dequeue from passing ``key`` until ``unhold`` (the token returned): for
        a write whose entries are not published yet. Call under the lock."""
        self._token += 1
        self._unpublished[self._token] = key
        return self._token

    def unhold(self: Queue, token: int) -> None:
        """Lift the barrier ``hold`` returned ``token`` for (no matter if lifted already)."""
        self._unpublished.pop(token, None)

    def _submit(
        self: Queue,
        payload: bytes,
        publish: Callable[[], None],
        result: Any,
        rollback: Callable[[], None] | None = None,
        meta: bytes = b"",
    ) -> Future[Any]:
        """Append one record; resolve with ``result`` once durable per the fsync mode."""
        sink = self.engine.replication
        if sink is not None and not sink.admits_writes():
            if rollback is not None:
                rollback()
            raise ReplicationStalled(
                "the replica group's sync set has acknowledged nothing for a commit timeout; "
                "the write was refused before anything was written: retry later",
                queue=self.name,
            )
        fut: Future[Any] = WriteFuture()
        wal = self.wal
        seq = wal.append(payload, meta)
        self.last_write = now = time.monotonic()
        mode = self.engine.config.fsync
        lsn = 0
        deadline = 0.0
        if sink is not None:  # a leader: the followers get the record as appended
            kind, body = record_body(payload, meta)
            lsn = self.last_lsn = sink.ship(self.name, kind, body)
            deadline = now + sink.commit_timeout_s
        if mode == "always":
            self._waiting.append(
                PendingBatch(wal, seq, publish, rollback, fut, result, lsn, deadline)
            )
            assert self.engine.syncer is not None
            self.engine.syncer.mark_dirty(self)
        else:
            data, _seq = wal.take_buffer()
            try:
                with wal.io_lock:
                    wal.write(data)
            except BaseException as exc:
                if rollback is not None:
                    rollback()
                answer(self._fail_locked(exc, "writing the log"))
                if isinstance(exc, StorageError):
                    raise
                assert self.failed is not None
                raise self.failed from exc
            publish()
            settle(fut, result)
            if mode == "interval" and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        if self.fill() >= self.engine.config.memseg_bytes:
            answer(self._request_rotation())
        return fut

    def _complete(self: Queue, wal: WalWriter, seq: int) -> list[Answer]:
        """``wal`` is synced up to ``seq``: publish what is now ready; return the answers."""
        for batch in self._waiting:
            if batch.wal is wal and batch.seq <= seq:
                batch.synced = True
        return self._publish_ready()

    def _publish_ready(self: Queue) -> list[Answer]:
        """Publish, in append order, every waiting batch that is synced and committed
        (``lsn`` 0 is not replicated); stop at the first that is not."""
        commit = self.engine.commit_lsn
        waiting = self._waiting
        done: list[Answer] = []
        n = 0
        for batch in waiting:
            if not batch.synced or batch.lsn > commit:
                break
            batch.publish()
            done.append((batch.future, batch.result, None))
            n += 1
        if n:
            self._waiting = waiting[n:]
        return done

    def awaits_commit(self: Queue) -> bool:
        """Some write waits for its sync or its commit (read without the lock: a hint)."""
        return bool(self._waiting)

    def publish_committed(self: Queue, now: float) -> list[Answer]:
        """The replica group's commit lsn moved (``Engine.commit``): publish what is now
        synced and committed, and answer ``ReplicationTimeout`` to replicated writes
        that waited past their deadline (``now``, monotonic seconds). Call under the
        lock; settle the answers once it is let go."""
        answers = self._publish_ready()
        if answers:
            self.notify()
        return answers + self._expire_waits(now)

    def drop_replicated(self: Queue, error: BaseException) -> list[Answer]:
        """Forget every waiting replicated batch (the sink that numbered it is gone):
        undo what it held in memory and answer ``error``; the next record shipped is
        numbered by the next sink. Its record stays in the log; a node that stops
        leading replaces its queues with the leader's copy. Call under the lock."""
        self.last_lsn = 0
        keep: list[PendingBatch] = []
        out: list[Answer] = []
        for batch in self._waiting:
            if batch.lsn == 0:
                keep.append(batch)
                continue
            if batch.rollback is not None:
                batch.rollback()
            out.append((batch.future, None, error))
        self._waiting = keep
        return out

    def _expire_waits(self: Queue, now: float) -> list[Answer]:
        """Answer ``ReplicationTimeout`` to replicated writes that waited too long for
        the sync set. They stay waiting: if they commit later they still publish."""
        out: list[Answer] = []
        for batch in self._waiting:
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

    def notify(self: Queue) -> None:
        for cb in list(self.watchers):
            try:
                cb()
            except Exception:
                log.exception("queue watcher failed")

    # ------------------------------------------------------------------ group commit

    def sync_round(self: Queue) -> float:
        """Called by the syncer: write and sync what is buffered, then publish it.
        Returns the seconds the write and the sync took (a committing thread backs off
        a slow disk with it, ``storage/syncer.py``).

        The log's ``io_lock`` is taken before the queue lock is let go, so no one can
        close the log between taking its buffer and writing it. Any write or sync error
        fails the queue, in every mode (``_fail_locked``).
        """
        mode = self.engine.config.fsync
        with self.lock:
            if not self.loaded or self.failed is not None or self.closed:
                return 0.0
            wal = self.wal
            data, seq = wal.take_buffer()
            wal.io_lock.acquire()
        error: BaseException | None = None
        started = time.perf_counter()
        try:
            wal.write(data)
            if mode != "never":
                t0 = time.perf_counter()
                wal.sync()
                self.engine.fsync_stats.observe(time.perf_counter() - t0)
        except BaseException as exc:
            error = exc
        finally:
            wal.io_lock.release()
        took = time.perf_counter() - started
        with self.lock:
            if error is not None:
                answers = self._fail_locked(error, "syncing the log")
            elif mode == "always":
                answers = self._complete(wal, seq)
                if self._rotate_requested and not self.closed and self.failed is None:
                    answers += self._rotate_locked()
            else:
                answers = []
            if any(e is None for _f, _r, e in answers):
                self.notify()
        answer(answers)
        return took
