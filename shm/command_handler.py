"""The engine calls of one ring session's commands, made for its compiled loop.

The session loop (``shm/_session.c``: wait, copy and decode each slot, start commands in
ring order, encode and publish every answer) enters Python once per command, calling one
method of this handler with arguments already decoded and checked against
``docs/shm.md``; the method makes that command's one engine call through the item
operations every front end calls (``storage/itemops.py``) and returns the engine's
answer, which the loop encodes. Invariants kept:
  - nothing a client writes reaches the engine unchecked: the loop refuses malformed
    fields with ``malformed`` and the engine validates names, sizes and deadlines before it
    writes anything, so a hostile ring yields error responses, never a corrupt queue;
  - durable ops (PUT, DELETE, REQUEUE, PUT_MANY, DELETE_MANY) return the engine's future
    and are answered only once it resolves (the loop hands it the answer): the same
    durability as an HTTP request. With ``fsync always`` the session's thread leads its
    own group commit (``commits``; ``storage/syncer.py``, ``lead``) once it has started
    the commands of a pass, or before it waits for their answers: a lone writer's
    commit needs no other thread, and concurrent sessions' writes share rounds. A run of PUTs (or DELETEs) that
    arrived together comes as one batch (``enqueue``, ``release``), as an HTTP batch
    would; if the engine refuses the batch as a whole, nothing of it was written, and the
    loop starts each command alone (``enqueue_one``, ``release_one``);
  - an exception of any call is answered with its status (``error``): every command gets
    exactly one response.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from dq.shm.command_ring import Status
from dq.storage.errors import NotLeader, StorageError
from dq.storage.itemops import ItemOps
from dq.storage.types import (
    Enqueued,
    Extend,
    ItemOutcome,
    NewItem,
    OnDuplicate,
    Release,
    Requeue,
    check_queue_name,
)
from dq.storage.waits import Leased

if TYPE_CHECKING:
    from dq.storage.syncer import InlineCommits

__all__ = ["STATUSES", "CommandHandler"]

log = logging.getLogger(__name__)

#: every status by its error code (``docs/shm.md``, "Status codes"): the compiled loop
#: answers an item's error code with its status, ``internal`` for a code it lacks
STATUSES: dict[str, int] = {status.code: int(status) for status in Status}


def _status_for(code: str) -> int:
    return STATUSES.get(code, int(Status.INTERNAL))


def _error(exc: BaseException) -> tuple[int, bytes]:
    if isinstance(exc, StorageError):
        if isinstance(exc, NotLeader):  # a follower: the client goes to the leader over HTTP
            if exc.leader:
                return int(Status.NOT_LEADER), exc.leader.encode()
            return int(Status.NO_LEADER), str(exc).encode()
        status = _status_for(exc.code)
        if status == Status.INTERNAL and exc.http_status == 503:  # unavailable for now
            status = int(Status.UNAVAILABLE)
        return status, str(exc).encode()
    log.exception("unexpected error serving a ring command", exc_info=exc)
    return int(Status.INTERNAL), f"internal error: {type(exc).__name__}".encode()


class CommandHandler:
    """One session's engine calls. Called by that session's loop (and ``error`` by the
    thread that resolves a write), never concurrently."""

    def __init__(
        self,
        engine: Any,
        queue: str | None,
        stopping: threading.Event,
        ops: ItemOps | None = None,
        woken: threading.Event | None = None,
    ) -> None:
        self._engine = engine
        #: the bound queue (``BIND``); the loop refuses every other op until there is one
        self.queue = queue
        self._name = queue or ""
        self._stopping = stopping
        ops = ops if ops is not None else ItemOps(engine)
        self._ops = ops
        self._start_enqueue = ops.start_enqueue
        self._start_release = ops.start_release
        #: what a long-polling FIND sleeps on; its session sets it when it stops
        self._woken = woken if woken is not None else threading.Event()
        #: the session thread's own group commits (writer-led, ``storage/syncer.py``),
        #: which its writes go to; None: the syncer thread's
        self.commits: InlineCommits | None = None

    # ---- durable: the engine's future, answered when it resolves -------------------------

    def enqueue_one(
        self, value: bytes, deadline: int | None, delay_ms: int | None
    ) -> Future[list[Enqueued]]:
        return self._start_enqueue(self._name, [NewItem(value, deadline, delay_ms)], self.commits)

    def enqueue(self, items: list[tuple[bytes, int | None, int | None]]) -> Future[list[Enqueued]]:
        items_ = [NewItem(v, d, dl) for v, d, dl in items]
        return self._start_enqueue(self._name, items_, self.commits)

    def release_one(self, item_id: int, receipt: str) -> Future[list[ItemOutcome]]:
        return self._start_release(self._name, [Release(item_id, receipt)], self.commits)

    def release(self, items: list[tuple[int, str]]) -> Future[list[ItemOutcome]]:
        return self._start_release(self._name, [Release(i, r) for i, r in items], self.commits)

    def requeue(
        self, item_id: int, receipt: str, deadline: int | None, delay_ms: int | None
    ) -> Future[list[ItemOutcome]]:
        requeue = Requeue(item_id, receipt, deadline, delay_ms)
        return self._ops.start_requeue(self._name, [requeue], self.commits)

    def put_many(
        self, items: list[tuple[bytes, int | None, int | None, str | None]], replace: bool = False
    ) -> Future[list[Enqueued]]:
        """A PUT_MANY; ``replace`` (its REPLACE flag): each keyed item has ``on_duplicate``
        "replace" — what that does is the enqueue's rule (``storage/dedup.py``)."""
        how: OnDuplicate = "replace" if replace else "keep"
        new = [NewItem(v, d, dl, k, None, how) for v, d, dl, k in items]
        return self._start_enqueue(self._name, new, self.commits)

    def delete_many(self, items: list[tuple[int, str]]) -> Future[list[ItemOutcome]]:
        return self.release(items)

    # ---- answered at once ----------------------------------------------------------------

    def extend(self, item_id: int, receipt: str, lease_ms: int) -> list[ItemOutcome]:
        return self._ops.extend(self._name, [Extend(item_id, receipt, lease_ms)])

    def find(self, count: int, wait_ms: int, lease_ms: int | None) -> Leased:
        """A dequeue, long-polling up to ``wait_ms`` (``storage/itemops.py``, as over
        HTTP): a queue not created yet has nothing due, and the wait goes on until it is
        (a worker may start before its producer); the answer says so (``NO_QUEUE``)."""
        return self._ops.lease_waiting(
            self._name, count, lease_ms, wait_ms, self._woken, self._stopping
        )

    def stats(self) -> bytes:
        stats = dataclasses.asdict(self._engine.stats(self._name))
        return json.dumps(stats, separators=(",", ":")).encode()

    def bind(self, name: bytes) -> None:
        self.queue = self._name = check_queue_name(name.decode("ascii", "replace"))

    def error(self, exc: BaseException) -> tuple[int, bytes]:
        """The status and message a command gets for ``exc`` (``StorageError``: its code)."""
        return _error(exc)
