"""Item routes under ``/v1/queues/{queue}``: enqueue, dequeue, release, requeue, extend.

Invariant: durable writes go through the engine's ``*_nowait`` calls and are awaited
on the loop (``_resolved``, which never cancels the engine's future) — the event loop
never blocks on an fsync, and requests in flight together share one group commit. Dequeue writes nothing durable and runs on
the loop; its long-poll is ``LongPoll`` (no thread per waiter).
The success path of a JSON enqueue or release batch usually arrives through
``server/fastpath.py`` instead, which shares ``durable`` and ``results_json`` with
these routes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Annotated, TypeVar

from fastapi import APIRouter, Path, Request, Response
from starlette.types import Receive

from server.dependencies import QueuePath, Service, service_of
from server.errors import ApiError
from server.routers._common import ERRORS, outcome_dict, single_outcome
from server.schemas import (
    DequeueRequest,
    DequeueResponse,
    Encoding,
    EnqueueRequest,
    EnqueueResponse,
    ExtendOne,
    ExtendRequest,
    InvalidItem,
    ItemResult,
    ReleaseOne,
    ReleaseRequest,
    RequeueOne,
    RequeueRequest,
    Results,
    encode_value,
    to_new_items,
)
from storage.codec import MAX_ID
from storage.errors import StorageError, WriteStall
from storage.types import Delivery, Enqueued, Extend, ItemOutcome, Release, Requeue

__all__ = ["disconnected", "durable", "enqueued_json", "results_json", "router", "serve_dequeue"]

router = APIRouter(prefix="/v1/queues/{queue}", tags=["items"], responses=ERRORS)

ItemIdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="item id")]
_perf = time.perf_counter
_STALL_TIMEOUT_S = 30.0
_STALL_NAP_S = 0.005
T = TypeVar("T")


def _check_batch(service: Service, n: int) -> None:
    if n > service.settings.max_batch:
        raise ApiError(
            413,
            "batch_too_large",
            f"{n} items in one request; the limit is {service.settings.max_batch}",
        )


async def durable(start: Callable[[], Future[T]]) -> T:
    """Await a durable write without blocking the loop; wait out short write stalls."""
    give_up = _perf() + _STALL_TIMEOUT_S
    while True:
        try:
            fut = start()
            if fut.done():  # fsync=never/interval: skip the cross-thread wake-up
                return fut.result()
            return await _resolved(fut)
        except WriteStall:
            if _perf() > give_up:
                raise
            await asyncio.sleep(_STALL_NAP_S)


def _resolved(fut: Future[T]) -> asyncio.Future[T]:
    """An asyncio future that follows ``fut`` but never cancels it.

    ``asyncio.wrap_future`` would cancel the engine's future when the request is
    cancelled (a client gone, a shutdown timeout); the engine's syncer thread then fails
    to ``set_result`` it, and the other requests of that group commit would be left
    waiting. The write itself happens either way.
    """
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def done(f: Future[T]) -> None:  # the syncer thread
        loop.call_soon_threadsafe(_transfer, f, waiter)

    fut.add_done_callback(done)
    return waiter


def _transfer(fut: Future[T], waiter: asyncio.Future[T]) -> None:
    if waiter.cancelled():
        return
    exc = fut.exception()
    if exc is not None:
        waiter.set_exception(exc)
    else:
        waiter.set_result(fut.result())


async def disconnected(receive: Receive) -> None:
    """Returns once the client has gone: the body is read, so the server's next message
    is ``http.disconnect``. Anything else (a pipelined request) and we stop watching."""
    if (await receive())["type"] != "http.disconnect":
        await asyncio.Event().wait()  # never: the long-poll runs its course


def _failed(service: Service, op: str, exc: StorageError, t0: float) -> None:
    service.metrics.observe_error(op, exc.code, _perf() - t0)


@router.post("/items", response_model=EnqueueResponse, summary="Enqueue one item or a batch")
async def enqueue(queue: QueuePath, body: EnqueueRequest, request: Request) -> Response:
    service = service_of(request)
    t0 = _perf()
    items = body.items
    _check_batch(service, len(items))
    try:
        new = to_new_items(items)
    except InvalidItem as exc:
        raise ApiError(422, "validation_error", str(exc)) from None
    try:
        done = await durable(lambda: service.engine.enqueue_nowait(queue, new))
    except StorageError as exc:
        _failed(service, "enqueue", exc, t0)
        raise
    service.metrics.observe("enqueue", _perf() - t0, len(done))
    return Response(enqueued_json(done), media_type="application/json")


def enqueued_json(done: Sequence[Enqueued]) -> bytes:
    """``EnqueueResponse``; shared with the fast path."""
    parts = [
        f'{{"id":{e.id:d},"deadline":{e.deadline:d},"duplicate":{"true" if e.duplicate else "false"}}}'
        for e in done
    ]
    return ('{"items":[' + ",".join(parts) + "]}").encode()


@router.post(
    "/dequeue",
    response_model=DequeueResponse,
    summary="Lease up to `count` due items, long-polling up to `wait_ms`",
)
async def dequeue(queue: QueuePath, body: DequeueRequest, request: Request) -> Response:
    service = service_of(request)
    settings = service.settings
    if body.count > settings.max_batch:
        raise ApiError(
            400, "invalid_argument", f"count {body.count} exceeds the limit {settings.max_batch}"
        )
    payload = await serve_dequeue(service, queue, body, partial(disconnected, request.receive))
    return Response(payload, media_type="application/json")


async def serve_dequeue(
    service: Service, queue: str, body: DequeueRequest, gone: Callable[[], Awaitable[object]]
) -> bytes:
    """Lease (long-polling if asked) and answer ``DequeueResponse`` JSON; shared with the
    fast path. ``body.count`` is within the batch limit."""
    t0 = _perf()
    wait_ms = min(body.wait_ms, service.settings.max_wait_ms)
    try:
        got = await service.longpoll.dequeue(queue, body.count, body.lease_ms, wait_ms, gone)
    except StorageError as exc:
        _failed(service, "dequeue", exc, t0)
        raise
    now = service.engine.now()
    metrics = service.metrics
    metrics.observe("dequeue", _perf() - t0, len(got))
    metrics.observe_lateness(now, (d.deadline for d in got))
    return _deliveries_json(got, body.encoding)


#: One delivered item as JSON (``ItemOut``). Formatting it directly is ~35 % cheaper
#: than building a dict per item and serializing the lot; strings go through
#: ``json.dumps`` (escaped, ASCII-only) and everything else is an integer.
_ITEM_JSON = (
    '{"id":%d,"receipt":%s,"value":%s,"encoding":"%s","deadline":%d,'
    '"stats":{"enqueue_time":%d,"requeue_time":%d,"dequeue_count":%d},"lease_expires":%d}'
)


def _deliveries_json(got: Sequence[Delivery], encoding: Encoding | None) -> bytes:
    dumps = json.dumps
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
    return ('{"items":[' + ",".join(parts) + "]}").encode()


async def _release(service: Service, queue: str, batch: Sequence[Release]) -> list[ItemOutcome]:
    t0 = _perf()
    _check_batch(service, len(batch))
    try:
        outcomes = await durable(lambda: service.engine.release_nowait(queue, batch))
    except StorageError as exc:
        _failed(service, "release", exc, t0)
        raise
    service.metrics.observe("release", _perf() - t0, len(outcomes))
    return outcomes


async def _requeue(service: Service, queue: str, batch: Sequence[Requeue]) -> list[ItemOutcome]:
    t0 = _perf()
    _check_batch(service, len(batch))
    try:
        outcomes = await durable(lambda: service.engine.requeue_nowait(queue, batch))
    except StorageError as exc:
        _failed(service, "requeue", exc, t0)
        raise
    service.metrics.observe("requeue", _perf() - t0, len(outcomes))
    return outcomes


def _extend(service: Service, queue: str, batch: Sequence[Extend]) -> list[ItemOutcome]:
    t0 = _perf()
    _check_batch(service, len(batch))
    try:
        outcomes = service.engine.extend(queue, batch)  # in memory: no durable write
    except StorageError as exc:
        _failed(service, "extend", exc, t0)
        raise
    service.metrics.observe("extend", _perf() - t0, len(outcomes))
    return outcomes


def _results(outcomes: Sequence[ItemOutcome]) -> Response:
    return Response(results_json(outcomes), media_type="application/json")


def results_json(outcomes: Sequence[ItemOutcome]) -> bytes:
    """``Results``; a plain success (most of a release batch) is formatted directly."""
    dumps = json.dumps
    parts = [
        f'{{"id":{o.id:d},"ok":true}}'
        if o.error is None and o.receipt is None and o.deadline is None and o.lease_expires is None
        else dumps(outcome_dict(o), separators=(",", ":"))
        for o in outcomes
    ]
    return ('{"results":[' + ",".join(parts) + "]}").encode()


@router.post("/release", response_model=Results, summary="Release (acknowledge) a batch")
async def release(queue: QueuePath, body: ReleaseRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Release(i["id"], i["receipt"]) for i in body.items]
    return _results(await _release(service, queue, batch))


@router.post("/requeue", response_model=Results, summary="Requeue a batch with new deadlines")
async def requeue(queue: QueuePath, body: RequeueRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Requeue(i.id, i.receipt, i.deadline, i.delay_ms) for i in body.items]
    return _results(await _requeue(service, queue, batch))


@router.post("/extend", response_model=Results, summary="Extend a batch of leases")
async def extend(queue: QueuePath, body: ExtendRequest, request: Request) -> Response:
    service = service_of(request)
    batch = [Extend(i.id, i.receipt, i.lease_ms) for i in body.items]
    return _results(_extend(service, queue, batch))


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
