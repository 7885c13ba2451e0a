"""The item operations every front end serves, each defined once.

Four front ends serve enqueue, dequeue, release, requeue, fail and extend: the HTTP routes
(``server/routers/items.py``), their fast path (``server/hot_routes.py``), the ring
(``shm/command_handler.py``) and SQS (``server/sqs/``). Each decodes its own wire
format, encodes its own answers (``server/answers.py`` in JSON, ``shm/command_codec.py``
in ring bytes) and times its calls; what an operation *is* lives here, once: the rules
its arguments keep (worded by ``storage/validation.py``), the engine calls it makes and
in which order, and the answer it gives (a dequeue's is ``Leased``: the deliveries,
whether the queue exists, whether the server is shutting down).

A long-poll waits on ``storage/waits.py``; the HTTP server awaits it on its loop
(``server/longpoll.py``), a ring session blocks on it (``lease_waiting``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Protocol, TypeVar

from dq.storage.errors import QueueNotFound
from dq.storage.types import (
    BrowsedItem,
    Enqueued,
    Extend,
    Fail,
    ItemOutcome,
    NewItem,
    Release,
    Requeue,
)
from dq.storage.validation import LEASE_MS, MAX_LEASE_MS, WAIT_MS, check_batch, count_range
from dq.storage.waits import Leased, Waits, leased

if TYPE_CHECKING:
    from dq.storage.engine import Engine
    from dq.storage.syncer import InlineCommits

__all__ = ["ItemOps", "StartWrite"]

_I = TypeVar("_I", contravariant=True)
_R = TypeVar("_R")


class StartWrite(Protocol[_I, _R]):
    """Starts a durable write of a batch of ``_I`` (an engine ``*_nowait`` call);
    ``inline``: the calling thread's own group commits (the HTTP server's event loop,
    ``Syncer.commit_inline``), which make the write durable at its next turn."""

    def __call__(
        self, queue: str, items: Sequence[_I], inline: InlineCommits | None = None, /
    ) -> Future[_R]: ...


class ItemOps:
    """The item operations of one engine, for every front end of one server.

    The writes are the engine's own calls, taken as they are (nothing is added per
    request: the engine checks each batch and item before it writes anything, and the
    futures resolve once the write is durable under the server's fsync mode):

    - ``start_enqueue(queue, items[, inline])``: enqueue a batch, creating the queue if
      needed;
    - ``start_release(queue, items[, inline])``: release a batch, one outcome per item
      (a stale receipt is an outcome, not an error);
    - ``start_requeue(queue, items[, inline])``: requeue a batch with new deadlines;
    - ``start_fail(queue, items[, inline])``: fail a batch, each item back under its
      queue's retry policy with its error kept (an error over 4 KiB refuses the batch
      before anything is done; a stale receipt is an outcome);
    - ``extend(queue, items)``: extend a batch of leases (in memory: nothing to wait for).

    The items a key names (``storage/keyops.py``; blocking calls, for a worker thread):

    - ``peek_key(queue, key[, with_values])``: the item, wherever it is;
    - ``cancel_key(queue, key)``: cancel it if pending; its id;
    - ``patch_key(queue, key, *, deadline, delay_ms, value)``: give it a new deadline
      and/or value if pending; its id and new deadline.
    """

    start_enqueue: StartWrite[NewItem, list[Enqueued]]
    start_release: StartWrite[Release, list[ItemOutcome]]
    start_requeue: StartWrite[Requeue, list[ItemOutcome]]
    start_fail: StartWrite[Fail, list[ItemOutcome]]
    extend: Callable[[str, Sequence[Extend]], list[ItemOutcome]]
    peek_key: Callable[..., BrowsedItem]
    cancel_key: Callable[[str, str], int]
    patch_key: Callable[..., Enqueued]

    def __init__(
        self, engine: Engine, *, max_wait_ms: int = 20_000, waits: Waits | None = None
    ) -> None:
        self.engine = engine
        #: a long-poll waits at most this long (``DQ_MAX_WAIT_MS``), on every transport
        self.max_wait_ms = max_wait_ms
        self.waits = waits if waits is not None else Waits(engine)
        self.max_batch = engine.config.max_batch
        self.start_enqueue = engine.enqueue_nowait
        self.start_release = engine.release_nowait
        self.start_requeue = engine.requeue_nowait
        self.start_fail = engine.fail_nowait
        self.extend = engine.extend
        self.peek_key = engine.peek_key
        self.cancel_key = engine.cancel_key
        self.patch_key = engine.patch_key

    # ------------------------------------------------------------------ dequeue

    def check_dequeue(
        self, count: int, lease_ms: int | None, wait_ms: int = 0, releases: int = 0
    ) -> None:
        """Refuse a dequeue that breaks a rule — ``count`` within the batch limit, the
        lease within 12 h, a wait not negative, at most a batch of releases carried —
        before anything it carries is released: a refused dequeue changes nothing."""
        limit = self.max_batch
        if (
            type(count) is not int
            or not 1 <= count <= limit
            or (
                lease_ms is not None
                and (type(lease_ms) is not int or not 1 <= lease_ms <= MAX_LEASE_MS)
            )
            or type(wait_ms) is not int
            or wait_ms < 0
            or releases > limit
        ):  # the rules themselves say which, in their words
            count_range(limit).check(count)
            if lease_ms is not None:
                LEASE_MS.check(lease_ms)
            WAIT_MS.check(wait_ms)
            check_batch(releases, limit)

    def wait_ms(self, asked: int) -> int:
        """How long a long-poll asking ``asked`` ms waits: at most the server's maximum."""
        return asked if asked <= self.max_wait_ms else self.max_wait_ms

    def lease(self, queue: str, count: int, lease_ms: int | None) -> Leased:
        """Lease what is due now (a queue that does not exist yet has nothing due)."""
        try:
            return Leased(self.engine.dequeue(queue, count, lease_ms))
        except QueueNotFound:
            return leased([], False, self.waits.draining)

    def lease_waiting(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        woken: threading.Event,
        stop: threading.Event,
    ) -> Leased:
        """A whole dequeue, long-poll included, for a thread that may block (a ring
        session: ``woken`` is what it sleeps on, set too when ``stop`` is)."""
        self.check_dequeue(count, lease_ms, wait_ms)
        return self.waits.wait_blocking(queue, count, lease_ms, self.wait_ms(wait_ms), woken, stop)
