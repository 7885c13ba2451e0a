"""What the fast path answers for a valid enqueue, dequeue or release: no framework.

FastAPI's request machinery (routing, dependencies, body validation, response
handling, Starlette's middleware) costs several times what the engine needs for a
single item. For the three hot routes — ``POST /v1/queues/{queue}/items``,
``/dequeue`` and ``/release`` with a JSON body — the HTTP protocol
(``server/protocol.py``) hands the complete body here instead. This module reads it
into the operations' arguments with compiled code (``server/hot_bodies.py``, which
accepts only what the routes' own pydantic schemas accept), calls the same operations (``storage/itemops.py``: rules, engine calls), meters them and long-polls as
the routes do (``dq.server.calls``, ``LongPoll``), and answers the same JSON
(``server/answers.py``) through the request's ``Responder``, from the loop and without
a task when the answer is ready at once or arrives with a group commit.

Anything it does not answer itself — a body the compiled reader declines (invalid,
unusual, or a batch over the limit), a write stall to wait out — it hands back (``Responder.fall_back``) to the FastAPI app, which words every
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

from pydantic import ValidationError

from dq.server.answers import enqueued_json, results_json
from dq.server.calls import Metered, dequeued, queue_exists
from dq.server.errors import INTERNAL_ERROR, error_json, header_lines, storage_error_reply
from dq.server.hot_bodies import DequeueBody, dequeue_body, enqueue_body, release_body
from dq.storage.errors import StorageError, WriteStall
from dq.storage.types import ItemOutcome

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

#: Dequeue bodies kept read and checked: at most this many, of at most this many bytes each.
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
        self._internal_error = error_json(*INTERNAL_ERROR)
        #: Dequeue bodies without releases, read and within the rules: a worker sends
        #: the same one (``{"count": 1}``) request after request.
        self._dequeues: dict[bytes, DequeueBody] = {}

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
        new = enqueue_body(body, self.max_batch)
        if new is None:  # the app words why (a batch over the limit: its 413)
            raise _FallBack
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
        released = release_body(body, self.max_batch)
        if released is None:
            raise _FallBack
        self._start_release(queue, released, reply, results_json)

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
            request = dequeue_body(body, self.max_batch)
            if request is None:
                raise _FallBack
            count, lease_ms, wait_ms, _, release = request
            try:  # a refused dequeue releases nothing: its own fields are checked first
                self.ops.check_dequeue(count, lease_ms, wait_ms, len(release or ()))
            except StorageError as exc:
                status, payload, headers = storage_error_reply(exc, f"POST /v1/queues/{queue}")
                reply(status, payload, header_lines(headers))
                return
            if release is None and len(body) <= _DEQUEUE_KEEP_BYTES:
                if len(self._dequeues) >= _DEQUEUES_KEPT:
                    self._dequeues.clear()
                # read, never changed, by what follows; kept once the rules passed it
                self._dequeues[body] = request
        releases = request[4]
        if not releases:
            self._lease(queue, request, None, reply, gone)
            return

        def then_lease(outcomes: list[ItemOutcome]) -> bytes | None:
            self._lease(queue, request, outcomes, reply, gone)
            return None  # _lease replies

        # A fall-back from here happens before anything is released.
        self._start_release(queue, releases, reply, then_lease)

    def _lease(
        self,
        queue: str,
        request: DequeueBody,
        released: list[ItemOutcome] | None,
        reply: Reply,
        gone: Callable[[], Awaitable[object]],
    ) -> None:
        service = self.service
        m = Metered(service, "dequeue")
        count, lease_ms, wait_ms, encoding, _ = request
        try:
            got = self.ops.lease(queue, count, lease_ms)
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        if got or wait_ms <= 0:
            reply(200, dequeued(service, m, got, encoding, released), b"")
            return
        # Nothing due and the client will wait: a long-poll, in a task of its own.
        task = asyncio.ensure_future(self._long_poll(queue, request, released, reply, gone))
        _tasks.add(task)
        task.add_done_callback(_tasks.discard)

    async def _long_poll(
        self,
        queue: str,
        request: DequeueBody,
        released: list[ItemOutcome] | None,
        reply: Reply,
        gone: Callable[[], Awaitable[object]],
    ) -> None:
        service = self.service
        m = Metered(service, "dequeue")
        count, lease_ms, wait, encoding, _ = request
        wait_ms = self.ops.wait_ms(wait)
        try:
            got = await service.longpoll.dequeue(queue, count, lease_ms, wait_ms, gone)
        except (StorageError, OSError) as exc:
            self._failed(m, exc, reply, queue)
            return
        reply(200, dequeued(service, m, got, encoding, released), b"")

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
