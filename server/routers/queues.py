"""Queue admin routes: list, read (config + live stats), create/update, delete.

Invariant: the JSON shape of a queue (``QueueInfo``) is built in one function here,
so ``GET /v1/queues`` and ``GET /v1/queues/{queue}`` cannot drift apart.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from fastapi import APIRouter, Query, Request, Response

from dq.server.dependencies import QueuePath, service_of
from dq.server.routers._common import ERRORS, json_response
from dq.server.schemas import GroupsOut, QueueConfigBody, QueueInfo, QueueList
from dq.storage.errors import QueueNotFound, StorageError
from dq.storage.operations import MAX_BROWSE
from dq.storage.retry import retry_from_json
from dq.storage.types import QueueConfig, QueueStats, RateLimit

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["queue_info", "router"]

router = APIRouter(prefix="/v1/queues", tags=["queues"], responses=ERRORS)
_perf = time.perf_counter


def queue_info(s: QueueStats) -> dict[str, object]:
    c = s.config
    rate = c.rate_limit
    return {
        "name": s.name,
        "config": {
            "default_lease_ms": c.default_lease_ms,
            "max_deliveries": c.max_deliveries,
            # the queue dead letters actually go to (<queue>.dlq unless configured)
            "dead_letter_queue": s.dead_letter_queue or c.dead_letter_queue,
            "dedup_window_ms": c.dedup_window_ms,
            "retry": None if c.retry is None else c.retry.to_json(),
            "group_limit": c.group_limit,
            "leased_limit": c.leased_limit,
            "fair": c.fair,
            "rate_limit": None
            if rate is None
            else {"per_second": rate.per_second, "burst": rate.burst, "per_group": rate.per_group},
        },
        "stats": {
            "pending": s.pending,
            "due": s.due,
            "delayed": s.delayed,
            "leased": s.leased,
            "segments": s.segments,
            "bytes_on_disk": s.bytes_on_disk,
            "oldest_due_age_ms": s.oldest_due_age_ms,
            "next_id": s.next_id,
            "extra": dict(s.extra),
            "paused": s.paused,
            "paused_since": s.paused_since,
            "dead_lettered": s.dead_lettered,
            "lease_expired": s.lease_expired,
            "oldest_lease_age_ms": s.oldest_lease_age_ms,
            "rates": {
                "enqueue_per_s": round(s.enqueue_per_s, 3),
                "dequeue_per_s": round(s.dequeue_per_s, 3),
                "release_per_s": round(s.release_per_s, 3),
            },
            "groups": s.groups,
            "held": s.held,
            "rate_limited": s.rate_limited,
        },
    }


@router.get("", response_model=QueueList, summary="Every queue with its config and stats")
async def list_queues(request: Request) -> Response:
    service = service_of(request)
    t0 = _perf()
    # In a worker thread: with thousands of queues the stats take long enough to stall
    # the event loop (the dashboard lists every queue every few seconds).
    out = await asyncio.to_thread(_all_queue_infos, service.engine)
    service.metrics.observe("queue_list", _perf() - t0, 0)
    return json_response({"queues": out})


def _all_queue_infos(engine: Engine) -> list[dict[str, object]]:
    out = []
    for name in engine.list_queues():
        try:
            out.append(queue_info(engine.stats(name)))
        except QueueNotFound:  # deleted meanwhile
            continue
    return out


@router.get("/{queue}", response_model=QueueInfo, summary="A queue's config and live stats")
async def get_queue(queue: QueuePath, request: Request) -> Response:
    service = service_of(request)
    t0 = _perf()
    try:
        info = queue_info(service.engine.stats(queue))
    except StorageError as exc:
        service.metrics.observe_error("queue_get", exc.code, _perf() - t0)
        raise
    service.metrics.observe("queue_get", _perf() - t0, 0)
    return json_response(info)


@router.put("/{queue}", response_model=QueueInfo, summary="Create a queue or replace its config")
async def put_queue(queue: QueuePath, body: QueueConfigBody, request: Request) -> Response:
    service = service_of(request)
    t0 = _perf()
    engine = service.engine
    rate = body.rate_limit
    try:
        retry = (
            None
            if body.retry is None
            else retry_from_json(body.retry.model_dump(exclude_none=True))
        )
        config = QueueConfig(
            body.default_lease_ms,
            body.max_deliveries,
            body.dead_letter_queue,
            body.dedup_window_ms,
            retry,
            group_limit=body.group_limit,
            leased_limit=body.leased_limit,
            fair=body.fair,
            rate_limit=None
            if rate is None
            else RateLimit(rate.per_second, rate.burst, rate.per_group),
        )
        await asyncio.to_thread(engine.put_queue, queue, config)  # writes and syncs metadata
        info = queue_info(engine.stats(queue))
    except StorageError as exc:
        service.metrics.observe_error("queue_put", exc.code, _perf() - t0)
        raise
    service.metrics.observe("queue_put", _perf() - t0, 0)
    return json_response(info)


@router.get(
    "/{queue}/groups",
    response_model=GroupsOut,
    summary="A queue's busiest groups: the most leased and held items",
)
async def get_groups(
    queue: QueuePath,
    request: Request,
    limit: int = Query(20, ge=1, le=MAX_BROWSE, description="groups to list, at most"),
) -> Response:
    service = service_of(request)
    t0 = _perf()
    try:
        top = await asyncio.to_thread(service.engine.groups, queue, limit)
    except StorageError as exc:
        service.metrics.observe_error("queue_groups", exc.code, _perf() - t0)
        raise
    service.metrics.observe("queue_groups", _perf() - t0, len(top))
    groups = [{"group": g.group, "leased": g.leased, "due": g.waiting, "held": g.held} for g in top]
    return json_response({"groups": groups})


@router.delete("/{queue}", status_code=204, summary="Delete a queue and all its items")
async def delete_queue(
    queue: QueuePath,
    request: Request,
    force: bool = Query(
        False,
        description="delete it even while other queues name it as their dead-letter "
        "queue (refused otherwise: 409 dead_letter_queue_in_use)",
    ),
) -> Response:
    service = service_of(request)
    t0 = _perf()
    try:
        await asyncio.to_thread(service.engine.delete_queue, queue, force=force)
    except StorageError as exc:
        service.metrics.observe_error("queue_delete", exc.code, _perf() - t0)
        raise
    service.metrics.observe("queue_delete", _perf() - t0, 0)
    return Response(status_code=204)
