"""Item routes under ``/v1/queues/{queue}``: enqueue, dequeue, release, requeue, fail,
extend.

Each route decodes its body (the request models of ``server/schemas.py``), calls the
operation (``storage/itemops.py``: its rules, its engine calls — the ones the ring and
SQS call too), and answers in JSON (``server/answers.py``). A valid enqueue, dequeue or
release usually arrives through the fast path (``server/hot_routes.py``) instead, which
calls the same operations and answers the same bytes.

Invariant: durable writes are awaited on the loop (``dq.server.calls.metered_durable``,
which never cancels the engine's future): the event loop never blocks on an fsync, and
requests in flight together share one group commit. Dequeue writes nothing durable and
runs on the loop; its long-poll is ``LongPoll`` (no thread per waiter). A dequeue may
carry releases of earlier deliveries; they are durable before anything is leased.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from functools import partial

from fastapi import APIRouter, Request, Response
from starlette.types import Receive

from dq.server.answers import enqueued_json, results_json
from dq.server.calls import Metered, dequeued, metered, metered_durable, queue_exists
from dq.server.dependencies import QueuePath, Service, service_of
from dq.server.errors import ApiError
from dq.server.routers._common import ERRORS, ItemIdPath, single_outcome
from dq.server.schemas import (
    DequeueRequest,
    DequeueResponse,
    EnqueueRequest,
    EnqueueResponse,
    ExtendOne,
    ExtendRequest,
    FailOne,
    FailRequest,
    InvalidItem,
    ItemResult,
    ReleaseOne,
    ReleaseRequest,
    RequeueOne,
    RequeueRequest,
    Results,
    to_new_items,
    to_releases,
)
from dq.storage.errors import StorageError
from dq.storage.types import Extend, Fail, ItemOutcome, Release, Requeue

__all__ = ["disconnected", "router"]

router = APIRouter(prefix="/v1/queues/{queue}", tags=["items"], responses=ERRORS)
_JSON = "application/json"


async def disconnected(receive: Receive) -> None:
    """Returns once the client has gone: the body is read, so the server's next message
    is ``http.disconnect``. Anything else (a pipelined request) and we stop watching."""
    if (await receive())["type"] != "http.disconnect":
        await asyncio.Event().wait()  # never: the long-poll runs its course


@router.post("/items", response_model=EnqueueResponse, summary="Enqueue one item or a batch")
async def enqueue(queue: QueuePath, body: EnqueueRequest, request: Request) -> Response:
    service = service_of(request)
    try:
        new = to_new_items(body.items)
    except InvalidItem as exc:
        raise ApiError(422, "validation_error", str(exc), details=exc.details()) from None
    ops = service.ops
    done = await metered_durable(
        service,
        "enqueue",
        lambda inline: ops.start_enqueue(queue, new, inline),
        off_loop=not queue_exists(service.engine, queue),
    )
    return Response(enqueued_json(done), media_type=_JSON)


@router.post(
    "/dequeue",
    response_model=DequeueResponse,
    summary="Lease up to `count` due items, long-polling up to `wait_ms`",
)
async def dequeue(queue: QueuePath, body: DequeueRequest, request: Request) -> Response:
    service = service_of(request)
    ops = service.ops
    # a refused dequeue releases nothing: its own fields are checked first
    ops.check_dequeue(body.count, body.lease_ms, body.wait_ms, len(body.release or ()))
    released = None
    if body.release:
        batch = to_releases(body.release)
        released = await metered_durable(
            service, "release", lambda inline: ops.start_release(queue, batch, inline)
        )
    m = Metered(service, "dequeue")
    gone = partial(disconnected, request.receive)
    try:
        got = await service.longpoll.dequeue(
            queue, body.count, body.lease_ms, ops.wait_ms(body.wait_ms), gone
        )
    except (StorageError, OSError) as exc:
        raise m.failed(exc) from None
    return Response(dequeued(service, m, got, body.encoding, released), media_type=_JSON)


async def _release(service: Service, queue: str, batch: Sequence[Release]) -> list[ItemOutcome]:
    ops = service.ops
    return await metered_durable(
        service, "release", lambda inline: ops.start_release(queue, batch, inline)
    )


async def _requeue(service: Service, queue: str, batch: Sequence[Requeue]) -> list[ItemOutcome]:
    ops = service.ops
    return await metered_durable(
        service, "requeue", lambda inline: ops.start_requeue(queue, batch, inline)
    )


async def _fail(service: Service, queue: str, batch: Sequence[Fail]) -> list[ItemOutcome]:
    ops = service.ops
    return await metered_durable(
        service, "fail", lambda inline: ops.start_fail(queue, batch, inline)
    )


def _extend(service: Service, queue: str, batch: Sequence[Extend]) -> list[ItemOutcome]:
    # in memory: no durable write
    return metered(service, "extend", lambda: service.ops.extend(queue, batch))


def _answer(outcomes: Sequence[ItemOutcome]) -> Response:
    return Response(results_json(outcomes), media_type=_JSON)


@router.post("/release", response_model=Results, summary="Release (acknowledge) a batch")
async def release(queue: QueuePath, body: ReleaseRequest, request: Request) -> Response:
    service = service_of(request)
    return _answer(await _release(service, queue, to_releases(body.items)))


@router.post("/requeue", response_model=Results, summary="Requeue a batch with new deadlines")
async def requeue(queue: QueuePath, body: RequeueRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Requeue(i.id, i.receipt, i.deadline, i.delay_ms) for i in body.items]
    return _answer(await _requeue(service, queue, batch))


@router.post(
    "/fail",
    response_model=Results,
    summary="Fail a batch: back under the queue's retry policy, each keeping its error",
)
async def fail(queue: QueuePath, body: FailRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Fail(i.id, i.receipt, i.error) for i in body.items]
    return _answer(await _fail(service, queue, batch))


@router.post("/extend", response_model=Results, summary="Extend a batch of leases")
async def extend(queue: QueuePath, body: ExtendRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Extend(i.id, i.receipt, i.lease_ms) for i in body.items]
    return _answer(_extend(service, queue, batch))


@router.post(
    "/items/{item_id}/release",
    response_model=ItemResult,
    summary="Release one item; a stale receipt is a 409",
)
async def release_one(
    queue: QueuePath, item_id: ItemIdPath, body: ReleaseOne, request: Request
) -> Response:
    service = service_of(request)
    return single_outcome(await _release(service, queue, [Release(item_id, body.receipt)]))


@router.post(
    "/items/{item_id}/requeue",
    response_model=ItemResult,
    summary="Requeue one item; a stale receipt is a 409",
)
async def requeue_one(
    queue: QueuePath, item_id: ItemIdPath, body: RequeueOne, request: Request
) -> Response:
    service = service_of(request)
    batch = [Requeue(item_id, body.receipt, body.deadline, body.delay_ms)]
    return single_outcome(await _requeue(service, queue, batch))


@router.post(
    "/items/{item_id}/fail",
    response_model=ItemResult,
    summary="Fail one item under the retry policy, keeping its error; a stale receipt is a 409",
)
async def fail_one(
    queue: QueuePath, item_id: ItemIdPath, body: FailOne, request: Request
) -> Response:
    service = service_of(request)
    return single_outcome(await _fail(service, queue, [Fail(item_id, body.receipt, body.error)]))


@router.post(
    "/items/{item_id}/extend",
    response_model=ItemResult,
    summary="Extend one lease; a stale receipt is a 409",
)
async def extend_one(
    queue: QueuePath, item_id: ItemIdPath, body: ExtendOne, request: Request
) -> Response:
    service = service_of(request)
    return single_outcome(_extend(service, queue, [Extend(item_id, body.receipt, body.lease_ms)]))
