"""Item routes under ``/v1/queues/{queue}``: enqueue, dequeue, release, requeue, extend.

Invariant: durable writes go through the engine's ``*_nowait`` calls and are awaited
on the loop (``dq.server.calls.metered_durable``, which never cancels the engine's
future): the event loop never blocks on an fsync, and requests in flight together share
one group commit. Dequeue writes nothing durable and runs on the loop; its long-poll is
``LongPoll`` (no thread per waiter). A dequeue may carry releases of earlier
deliveries; they are durable before anything is leased. A valid enqueue, dequeue or
release usually arrives through the fast path (``server/hot_routes.py``) instead, which
runs the same steps with the helpers exported here, so both answer the same bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from starlette.types import Receive

from dq.server.batch_limit import batch_too_large_message
from dq.server.calls import Metered, metered, metered_durable, queue_exists
from dq.server.dependencies import QueuePath, Service, service_of
from dq.server.errors import ApiError
from dq.server.routers._common import ERRORS, outcome_dict, single_outcome
from dq.server.schemas import (
    DequeueRequest,
    DequeueResponse,
    Encoding,
    EnqueueRequest,
    EnqueueResponse,
    ExtendOne,
    ExtendRequest,
    InvalidItem,
    ItemResult,
    ReleaseItem,
    ReleaseOne,
    ReleaseRequest,
    RequeueOne,
    RequeueRequest,
    Results,
    encode_value,
    new_release,
    to_new_items,
)
from dq.storage.codec import MAX_ID
from dq.storage.errors import QueueNotFound, StorageError
from dq.storage.types import Delivery, Enqueued, Extend, ItemOutcome, Release, Requeue
from dq.storage.validation import check_lease_ms

__all__ = [
    "check_dequeue",
    "delivered",
    "deliveries_json",
    "dequeue_now",
    "disconnected",
    "enqueued_json",
    "release_durable",
    "releases",
    "results_json",
    "router",
    "serve_dequeue",
]

router = APIRouter(prefix="/v1/queues/{queue}", tags=["items"], responses=ERRORS)

ItemIdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="item id")]
_JSON = "application/json"


def _check_batch(service: Service, n: int) -> None:
    """``BatchLimit`` refuses most over-long batches before they are parsed."""
    limit = service.settings.max_batch
    if n > limit:
        raise ApiError(413, "batch_too_large", batch_too_large_message(limit))


async def disconnected(receive: Receive) -> None:
    """Returns once the client has gone: the body is read, so the server's next message
    is ``http.disconnect``. Anything else (a pipelined request) and we stop watching."""
    if (await receive())["type"] != "http.disconnect":
        await asyncio.Event().wait()  # never: the long-poll runs its course


@router.post("/items", response_model=EnqueueResponse, summary="Enqueue one item or a batch")
async def enqueue(queue: QueuePath, body: EnqueueRequest, request: Request) -> Response:
    service = service_of(request)
    items = body.items
    _check_batch(service, len(items))
    try:
        new = to_new_items(items)
    except InvalidItem as exc:
        raise ApiError(422, "validation_error", str(exc), details=exc.details()) from None
    engine = service.engine
    done = await metered_durable(
        service,
        "enqueue",
        lambda: engine.enqueue_nowait(queue, new),
        off_loop=not queue_exists(engine, queue),
    )
    return Response(enqueued_json(done), media_type=_JSON)


#: One enqueued item as JSON (``EnqueuedItem``), by whether it was a duplicate: one
#: ``%`` a line, ~40 % cheaper than an f-string choosing the word inside it.
_ENQUEUED_JSON = '{"id":%d,"deadline":%d,"duplicate":false}'
_DUPLICATE_JSON = '{"id":%d,"deadline":%d,"duplicate":true}'


def enqueued_json(done: Sequence[Enqueued]) -> bytes:
    """``EnqueueResponse``; shared with the fast path."""
    fresh, again = _ENQUEUED_JSON, _DUPLICATE_JSON
    parts = [(again if e.duplicate else fresh) % (e.id, e.deadline) for e in done]
    return ('{"items":[' + ",".join(parts) + "]}").encode()


@router.post(
    "/dequeue",
    response_model=DequeueResponse,
    summary="Lease up to `count` due items, long-polling up to `wait_ms`",
)
async def dequeue(queue: QueuePath, body: DequeueRequest, request: Request) -> Response:
    service = service_of(request)
    check_dequeue(service, body)
    payload = await serve_dequeue(service, queue, body, partial(disconnected, request.receive))
    return Response(payload, media_type=_JSON)


def check_dequeue(service: Service, body: DequeueRequest) -> None:
    """The limits a dequeue's body must keep (``count``, ``lease_ms``, releases carried),
    checked before the releases it carries are applied: a refused dequeue releases
    nothing."""
    limit = service.settings.max_batch
    if body.count > limit:
        raise ApiError(400, "invalid_argument", f"count {body.count} exceeds the limit {limit}")
    if body.lease_ms is not None:
        check_lease_ms(body.lease_ms)
    if body.release is not None:
        _check_batch(service, len(body.release))


def dequeue_now(service: Service, queue: str, count: int, lease_ms: int | None) -> list[Delivery]:
    """Lease what is due now; a queue that does not exist yet has nothing due."""
    try:
        return service.engine.dequeue(queue, count, lease_ms)
    except QueueNotFound:
        return []


async def serve_dequeue(
    service: Service, queue: str, body: DequeueRequest, gone: Callable[[], Awaitable[object]]
) -> bytes:
    """Release what the body carries, lease (long-polling if asked) and answer
    ``DequeueResponse`` JSON; the fast path runs the same steps. Limits are checked."""
    released = None
    if body.release:
        released = await release_durable(service, queue, releases(body.release))
    m = Metered(service, "dequeue")
    wait_ms = min(body.wait_ms, service.settings.max_wait_ms)
    try:
        got = await service.longpoll.dequeue(queue, body.count, body.lease_ms, wait_ms, gone)
    except (StorageError, OSError) as exc:
        raise m.failed(exc) from None
    return delivered(service, m, got, body.encoding, released)


def releases(items: Sequence[ReleaseItem]) -> list[Release]:
    new = new_release
    return [new(i["id"], i["receipt"]) for i in items]


async def release_durable(
    service: Service, queue: str, batch: Sequence[Release]
) -> list[ItemOutcome]:
    engine = service.engine
    return await metered_durable(service, "release", lambda: engine.release_nowait(queue, batch))


def delivered(
    service: Service,
    m: Metered,
    got: Sequence[Delivery],
    encoding: Encoding | None,
    released: Sequence[ItemOutcome] | None,
) -> bytes:
    """Record a finished dequeue and answer it (``DequeueResponse``)."""
    m.ok(got)
    if got:  # an empty answer (a worker polling an empty queue) has no lateness
        service.metrics.observe_lateness(service.engine.now(), [d.deadline for d in got])
    return deliveries_json(got, encoding, released)


#: One delivered item as JSON (``ItemOut``). Formatting it directly is ~35 % cheaper
#: than building a dict per item and serializing the lot; strings are quoted as
#: ``json.dumps`` quotes them (escaped, ASCII-only) and everything else is an integer.
#: ``json.dumps(text)`` for a ``str``, without its two Python layers (it calls this).
_quoted = encode_basestring_ascii

_ITEM_JSON = (
    '{"id":%d,"receipt":%s,"value":%s,"encoding":"%s","deadline":%d,'
    '"stats":{"enqueue_time":%d,"requeue_time":%d,"dequeue_count":%d},"lease_expires":%d}'
)


def deliveries_json(
    got: Sequence[Delivery],
    encoding: Encoding | None,
    released: Sequence[ItemOutcome] | None = None,
) -> bytes:
    dumps = _quoted
    parts = []
    for d in got:
        text, enc = encode_value(d.value, encoding)
        s = d.stats
        parts.append(
            _ITEM_JSON
            % (
                d.id, dumps(d.receipt), dumps(text), enc, d.deadline,
                s.enqueue_time, s.requeue_time, s.dequeue_count, d.lease_expires,
            )
        )  # fmt: skip
    tail = "]}" if released is None else '],"released":[' + _results(released) + "]}"
    return ('{"items":[' + ",".join(parts) + tail).encode()


async def _release(service: Service, queue: str, batch: Sequence[Release]) -> list[ItemOutcome]:
    _check_batch(service, len(batch))
    return await release_durable(service, queue, batch)


async def _requeue(service: Service, queue: str, batch: Sequence[Requeue]) -> list[ItemOutcome]:
    _check_batch(service, len(batch))
    engine = service.engine
    return await metered_durable(service, "requeue", lambda: engine.requeue_nowait(queue, batch))


def _extend(service: Service, queue: str, batch: Sequence[Extend]) -> list[ItemOutcome]:
    _check_batch(service, len(batch))
    # in memory: no durable write
    return metered(service, "extend", lambda: service.engine.extend(queue, batch))


def _results(outcomes: Sequence[ItemOutcome]) -> str:
    """The items of ``Results``; a plain success (most of a release batch) is
    formatted directly."""
    dumps = json.dumps
    return ",".join(
        f'{{"id":{o.id:d},"ok":true}}'
        if o.error is None and o.receipt is None and o.deadline is None and o.lease_expires is None
        else dumps(outcome_dict(o), separators=(",", ":"))
        for o in outcomes
    )


def results_json(outcomes: Sequence[ItemOutcome]) -> bytes:
    """``Results``; shared with the fast path."""
    return ('{"results":[' + _results(outcomes) + "]}").encode()


def _answer(outcomes: Sequence[ItemOutcome]) -> Response:
    return Response(results_json(outcomes), media_type=_JSON)


@router.post("/release", response_model=Results, summary="Release (acknowledge) a batch")
async def release(queue: QueuePath, body: ReleaseRequest, request: Request) -> Response:
    service = service_of(request)
    batch = releases(body.items)
    return _answer(await _release(service, queue, batch))


@router.post("/requeue", response_model=Results, summary="Requeue a batch with new deadlines")
async def requeue(queue: QueuePath, body: RequeueRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Requeue(i.id, i.receipt, i.deadline, i.delay_ms) for i in body.items]
    return _answer(await _requeue(service, queue, batch))


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
    "/items/{item_id}/extend",
    response_model=ItemResult,
    summary="Extend one lease; a stale receipt is a 409",
)
async def extend_one(
    queue: QueuePath, item_id: ItemIdPath, body: ExtendOne, request: Request
) -> Response:
    service = service_of(request)
    return single_outcome(_extend(service, queue, [Extend(item_id, body.receipt, body.lease_ms)]))
