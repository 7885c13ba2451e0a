"""Timed, metered engine calls: the one wrapper every route and the fast path use.

``Metered`` times one operation from its start and records its outcome exactly once
(``ok`` with the items handled, or ``failed`` with the error code); ``metered`` and
``metered_durable`` wrap a synchronous and a durable engine call with it. Failures
leave as ``StorageError`` (an ``OSError`` that escaped the engine becomes a 503, see
``dq.server.errors.as_storage_error``). Invariant: a durable write is awaited on the loop
without blocking it and without cancelling the engine's future; a short write stall is
waited out, up to ``STALL_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence, Sized
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

from dq.server.answers import dequeued_json
from dq.server.errors import as_storage_error
from dq.storage.errors import QueueNotFound, StorageError, WriteStall
from dq.storage.syncer import InlineCommits

if TYPE_CHECKING:
    from dq.server.dependencies import Service
    from dq.server.schemas import Encoding
    from dq.storage import Engine
    from dq.storage.types import ItemOutcome
    from dq.storage.waits import Leased

__all__ = [
    "STALL_TIMEOUT_S",
    "Metered",
    "dequeued",
    "durable",
    "metered",
    "metered_durable",
    "queue_exists",
]

STALL_TIMEOUT_S = 30.0
_STALL_NAP_S = 0.005
_perf = time.perf_counter
T = TypeVar("T", bound=Sized)
R = TypeVar("R")
#: starts an engine write (a ``*_nowait`` call), given the loop's own commits or None
Start = Callable[[InlineCommits | None], Future[R]]


class Metered:
    """One operation's timing and outcome, recorded once into the app's metrics."""

    __slots__ = ("metrics", "op", "t0")

    def __init__(self, service: Service, op: str) -> None:
        self.metrics = service.metrics
        self.op = op
        self.t0 = _perf()

    def ok(self, result: Sized) -> None:
        self.metrics.observe(self.op, _perf() - self.t0, len(result))

    def failed(self, exc: BaseException) -> StorageError:
        """Record the failure; returns it as the ``StorageError`` to answer."""
        error = as_storage_error(exc)
        self.metrics.observe_error(self.op, error.code, _perf() - self.t0)
        return error


def dequeued(
    service: Service,
    m: Metered,
    got: Leased,
    encoding: Encoding | None,
    released: Sequence[ItemOutcome] | None,
) -> bytes:
    """Record a finished dequeue and answer it (``DequeueResponse``)."""
    m.ok(got)
    if got:  # an empty answer (a worker polling an empty queue) has no lateness
        service.metrics.observe_lateness(service.engine.now(), [d.deadline for d in got])
    return dequeued_json(got, encoding, released, got.queue_exists)


def metered(service: Service, op: str, call: Callable[[], T]) -> T:
    """A synchronous engine call (dequeue, extend), timed and counted."""
    m = Metered(service, op)
    try:
        result = call()
    except (StorageError, OSError) as exc:
        raise m.failed(exc) from None
    m.ok(result)
    return result


async def metered_durable(
    service: Service, op: str, start: Start[T], *, off_loop: bool = False
) -> T:
    """A durable engine write (``*_nowait``), awaited on the loop, timed and counted.

    ``off_loop``: hand the write over from a worker thread, for a write that may first
    create its queue (which writes and syncs several files)."""
    m = Metered(service, op)
    try:
        result = await durable(service, start, off_loop=off_loop)
    except StorageError as exc:
        raise m.failed(exc) from None
    m.ok(result)
    return result


async def durable(service: Service, start: Start[R], *, off_loop: bool = False) -> R:
    """A durable engine write awaited on the loop, short write stalls waited out; for
    callers that count it themselves. ``start(inline)`` must only start the write (an
    engine ``*_nowait`` call, passing ``inline`` on): on the loop it gets the loop's own
    commits, ``service.inline``, so the loop makes the write durable at its next turn;
    from a worker thread None. Raises ``StorageError`` only."""
    give_up = _perf() + STALL_TIMEOUT_S
    while True:
        try:
            if off_loop:
                fut = await asyncio.to_thread(start, None)
            else:
                fut = start(service.inline)  # only starts the write: the loop commits it
            return fut.result() if fut.done() else await service.completions.wait(fut)
        except WriteStall:
            if _perf() > give_up:
                raise
            await asyncio.sleep(_STALL_NAP_S)
        except OSError as exc:
            raise as_storage_error(exc) from None


def queue_exists(engine: Engine, name: str) -> bool:
    """False only for a well-formed name of a queue that does not exist (yet)."""
    if engine.has_queue(name):  # the common case: one dict lookup
        return True
    try:
        engine.get_queue(name)
    except QueueNotFound:
        return False
    except StorageError:
        return True  # a bad name or a closed engine: the call itself will say so
    return True
