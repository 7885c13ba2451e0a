"""What the fast path answers for a valid enqueue, dequeue or release: no framework.

FastAPI's request machinery (routing, dependencies, body validation, response
handling, Starlette's middleware) costs several times what the engine needs for a
single item. For the three hot routes — ``POST /v1/queues/{queue}/items``,
``/dequeue`` and ``/release`` with a JSON body — the HTTP protocol
(``server/protocol.py``) hands the complete body here instead. This module validates
it with the routes' own pydantic schemas (in Rust, from the raw JSON), calls the same
operations (``storage/itemops.py``: rules, engine calls), meters them and long-polls as
the routes do (``dq.server.calls``, ``LongPoll``), and answers the same JSON
(``server/answers.py``) through the request's ``Responder``, from the loop and without
a task when the answer is ready at once or arrives with a group commit.

Anything it does not answer itself — a body that fails validation, a write stall to
wait out — it hands back (``Responder.fall_back``) to the FastAPI app, which words every
such answer; the operations' refusals and storage errors it renders with
``dq.server.errors``, as the routes' handler does. Invariant: whichever path serves a
request, the answer is the same bytes (``tests/server/test_hot_path.py`` compares them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import TypeAdapter, ValidationError

from dq.server.answers import enqueued_json, results_json
from dq.server.batch_limit import over_batch
from dq.server.calls import Metered, dequeued, queue_exists
from dq.server.errors import INTERNAL_ERROR, error_json, header_lines, storage_error_reply
from dq.server.schemas import (
    DequeueRequest,
    EnqueueRequest,
    InvalidItem,
    ReleaseRequest,
    to_new_items,
    to_releases,
)
from dq.storage.errors import StorageError, WriteStall
from dq.storage.types import ItemOutcome
from dq.storage.validation import batch_too_large_message

if TYPE_CHECKING:
    from dq.server.dependencies import Service

__all__ = ["HOT_ROUTES", "PULL_ROUTE", "FastPathSlot", "HotRoutes", "Responder"]

logger = logging.getLogger(__name__)

#: The last path segment of each hot route.
HOT_ROUTES = frozenset({"items", "dequeue", "release"})
#: The route name of ``POST /v1/replica/pull`` (a replica group's follower pulling).
PULL_ROUTE = "replica/pull"


class Responder(Protocol):
    """How a hot request is answered; the protocol's per-request object
    (``server/protocol.py``). Exactly one of ``reply``, ``fall_back`` and ``broke`` is
    called, once."""

    def reply(self, status: int, body: bytes, headers: bytes, content_type: bytes = b"") -> None:
        """Write the answer; ``headers``: an error's own header lines, rendered by
        ``dq.server.errors.header_lines`` (``b""``: none); ``content_type``: the body's
        when it is not JSON."""

    def fall_back(self) -> None:
        """Hand the request, unanswered, to the FastAPI app."""

    def broke(self, body: bytes) -> None:
        """Answer a request that met a bug as the framework does: 500 with ``body``,
        then the connection closed (nothing pipelined behind it is read)."""

    def gone(self) -> Awaitable[object]:
        """Completes when the client has disconnected (a long-poll stops waiting)."""


#: ``reply(status, body, headers)`` of a ``Responder``.
Reply = Callable[[int, bytes, bytes], None]

_ENQUEUE = TypeAdapter(EnqueueRequest)
_RELEASE = TypeAdapter(ReleaseRequest)
_DEQUEUE = TypeAdapter(DequeueRequest)
#: Dequeue bodies kept validated: at most this many, of at most this many bytes each.
_DEQUEUES_KEPT = 64
_DEQUEUE_KEEP_BYTES = 256


class FastPathSlot:
    """Where the HTTP protocol finds the running service's ``HotRoutes``: set by the
    lifespan while it runs (``None`` while starting or stopping: the app answers), kept
    on the app's state. A plain attribute read per request, where reading the state of
    a Starlette app costs a Python-level ``__getattr__``."""

    __slots__ = ("hot",)

    def __init__(self) -> None:
        self.hot: HotRoutes | None = None


class HotRoutes:
    """Serves the hot routes of one running service."""

    def __init__(self, service: Service, state: Any = None) -> None:
        self.service = service
        self.ops = service.ops
        #: the app's state: ``node`` and ``replicator`` of a replica group's member
        self.state = state
        self.max_batch = service.settings.max_batch
        self._too_large = error_json("batch_too_large", batch_too_large_message(self.max_batch))
        self._internal_error = error_json(*INTERNAL_ERROR)
        #: Dequeue bodies without releases, validated and within the rules: a worker
        #: sends the same one (``{"count": 1}``) request after request, and validation
        #: is most of what the fast path spends on it beside the engine.
        self._dequeues: dict[bytes, DequeueRequest] = {}

    def serve(
        self,
        route: str,
        queue: str,
        body: bytes,
        responder: Responder,
    ) -> None:
        """Answer through ``responder``: reply, or fall back having answered nothing."""
        reply = responder.reply
        if route == PULL_ROUTE:
            try:
                self._pull(body, responder)
            except _FallBack:
                responder.fall_back()
            return
        if over_batch(body, self.max_batch):
            reply(413, self._too_large, b"")
            return
        try:
            if route == "items":
                self._enqueue(queue, body, reply)
            elif route == "release":
                self._release(queue, body, reply)
            else:
                self._dequeue(queue, body, reply, responder.gone)
        except _FallBack:
            responder.fall_back()
        except Exception:  # a bug: answered as the framework's handler answers it
            logger.exception("unhandled error on POST /v1/queues/%s/%s", queue, route)
            responder.broke(self._internal_error)

    # ------------------------------------------------------------------ enqueue

    def _enqueue(self, queue: str, body: bytes, reply: Reply) -> None:
        try:
            new = to_new_items(_ENQUEUE.validate_json(body).items)
        except (ValidationError, InvalidItem):
            raise _FallBack from None
        if not queue_exists(self.service.engine, queue):
            raise _FallBack  # its creation syncs files: the route does it off the loop
        m = Metered(self.service, "enqueue")
        try:
            fut = self.ops.start_enqueue(queue, new, self.service.inline)
        except WriteStall:
            raise _FallBack from None  # the route waits it out
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        self._when_durable(fut, m, enqueued_json, reply, queue)

    # ------------------------------------------------------------------ release

    def _release(self, queue: str, body: bytes, reply: Reply) -> None:
        try:
            released = _RELEASE.validate_json(body).items
        except ValidationError:
            raise _FallBack from None
        self._start_release(queue, to_releases(released), reply, results_json)

    def _start_release(
        self,
        queue: str,
        batch: list[Any],
        reply: Reply,
        answer: Callable[[list[ItemOutcome]], bytes | None],
    ) -> None:
        m = Metered(self.service, "release")
        try:
            fut = self.ops.start_release(queue, batch, self.service.inline)
        except WriteStall:
            raise _FallBack from None
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        self._when_durable(fut, m, answer, reply, queue)

    # ------------------------------------------------------------------ dequeue

    def _dequeue(
        self,
        queue: str,
        body: bytes,
        reply: Reply,
        gone: Callable[[], Awaitable[object]],
    ) -> None:
        request = self._dequeues.get(body)
        if request is None:
            try:
                request = _DEQUEUE.validate_json(body)
            except ValidationError:
                raise _FallBack from None
            try:  # a refused dequeue releases nothing: its own fields are checked first
                self.ops.check_dequeue(
                    request.count, request.lease_ms, request.wait_ms, len(request.release or ())
                )
            except StorageError as exc:
                status, payload, headers = storage_error_reply(exc, f"POST /v1/queues/{queue}")
                reply(status, payload, header_lines(headers))
                return
            if request.release is None and len(body) <= _DEQUEUE_KEEP_BYTES:
                if len(self._dequeues) >= _DEQUEUES_KEPT:
                    self._dequeues.clear()
                # read, never changed, by what follows; kept once the rules passed it
                self._dequeues[body] = request
        if not request.release:
            self._lease(queue, request, None, reply, gone)
            return

        def then_lease(outcomes: list[ItemOutcome]) -> bytes | None:
            self._lease(queue, request, outcomes, reply, gone)
            return None  # _lease replies

        # A fall-back from here happens before anything is released.
        self._start_release(queue, to_releases(request.release), reply, then_lease)

    def _lease(
        self,
        queue: str,
        request: DequeueRequest,
        released: list[ItemOutcome] | None,
        reply: Reply,
        gone: Callable[[], Awaitable[object]],
    ) -> None:
        service = self.service
        m = Metered(service, "dequeue")
        try:
            got = self.ops.lease(queue, request.count, request.lease_ms)
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        if got or request.wait_ms <= 0:
            reply(200, dequeued(service, m, got, request.encoding, released), b"")
            return
        # Nothing due and the client will wait: a long-poll, in a task of its own.
        task = asyncio.ensure_future(self._long_poll(queue, request, released, reply, gone))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def _long_poll(
        self,
        queue: str,
        request: DequeueRequest,
        released: list[ItemOutcome] | None,
        reply: Reply,
        gone: Callable[[], Awaitable[object]],
    ) -> None:
        service = self.service
        m = Metered(service, "dequeue")
        wait_ms = self.ops.wait_ms(request.wait_ms)
        try:
            got = await service.longpoll.dequeue(
                queue, request.count, request.lease_ms, wait_ms, gone
            )
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        reply(200, dequeued(service, m, got, request.encoding, released), b"")

    # ------------------------------------------------------------------ replica pull

    def _pull(self, body: bytes, responder: Responder) -> None:
        """A follower's pull, as ``server/replication/routes.py`` answers it when all
        is well; anything else (no replicator, a body the schema refuses, a refusal)
        falls back to that route, which words it."""
        from dq.server.replication.hot_pull import PULL_REQUEST, answer_pull

        state = self.state
        rep = getattr(state, "replicator", None)
        if getattr(state, "node", None) is None or rep is None or rep.closed:
            raise _FallBack
        try:
            request = PULL_REQUEST.validate_json(body)
        except ValidationError:
            raise _FallBack from None
        task = asyncio.get_running_loop().create_task(answer_pull(rep, request, responder, state))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    # ------------------------------------------------------------------ shared

    def _when_durable(
        self,
        fut: Future[Any],
        m: Metered,
        answer: Callable[[Any], bytes | None],
        reply: Reply,
        queue: str,
    ) -> None:
        def done(f: Future[Any]) -> None:
            try:
                result = f.result()  # done: one look under the future's lock, not two
            except BaseException as exc:
                self._failed(m, exc, reply, queue)
                return
            m.ok(result)
            payload = answer(result)
            if payload is not None:
                reply(200, payload, b"")

        self.service.completions.when_done(fut, done)

    def _failed(self, m: Metered, exc: BaseException, reply: Reply, queue: str) -> None:
        error = m.failed(exc)
        status, payload, headers = storage_error_reply(error, f"POST /v1/queues/{queue}")
        reply(status, payload, header_lines(headers))


class _FallBack(Exception):
    """The request is not for the fast path: the FastAPI app answers it."""


#: Long-polls in flight (the loop keeps only weak references to tasks).
_tasks: set[asyncio.Task[None]] = set()
