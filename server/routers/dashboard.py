"""The dashboard's own reads: ``GET /v1/history`` (charts), ``GET /v1/server`` (server
view) and ``GET /v1/session`` (what the signed-in token may do).

All are plain reads behind the same bearer auth as every /v1 route (a read-only token may
call them). Invariant: none walks item data: history answers from the sampler's bounded rings, the server view from
queue stats (which the engine keeps in memory) and one ``statvfs`` of the data volume.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from importlib import metadata
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel

from dq.server.auth import role
from dq.server.dependencies import service_of
from dq.server.routers._common import ERRORS, json_response
from dq.storage.errors import QueueNotFound, StorageError
from dq.storage.types import check_queue_name

__all__ = ["router", "server_info"]

router = APIRouter(prefix="/v1", tags=["dashboard"], responses=ERRORS)


class HistoryOut(BaseModel):
    """Columns of samples, oldest first; a rate the engine does not report is null."""

    queue: str | None
    tracked: bool
    interval_ms: int
    max_queues: int
    t: list[int]
    due: list[int]
    delayed: list[int]
    leased: list[int]
    enqueue_per_s: list[float | None]
    dequeue_per_s: list[float | None]
    release_per_s: list[float | None]


class SessionOut(BaseModel):
    """``role``: "admin" may do everything, "read" only GET (``DQ_READ_TOKENS``)."""

    auth: bool
    role: str


class QueueDisk(BaseModel):
    name: str
    segments: int
    frozen: int
    bytes_on_disk: int


class ShmClient(BaseModel):
    number: int
    pid: int | None
    shm: str | None
    capacity: int | None
    queue: str | None


class ShmOut(BaseModel):
    enabled: bool
    clients: list[ShmClient]


class DiskOut(BaseModel):
    total: int
    used: int
    free: int


class HistoryBounds(BaseModel):
    interval_ms: int
    retention_ms: int
    max_queues: int
    tracked_queues: int


class ServerOut(BaseModel):
    version: str
    data_dir: str
    fsync: str
    fsync_interval_ms: int
    started_at: int
    uptime_ms: int
    auth: bool
    queue_count: int
    data_bytes: int
    disk: DiskOut
    queues: list[QueueDisk]
    shm: ShmOut
    history: HistoryBounds


def _version() -> str:
    try:
        return metadata.version("deadline-queue")
    except metadata.PackageNotFoundError:
        return "unknown"


@router.get(
    "/history",
    response_model=HistoryOut,
    summary="Depth and rates over time (one queue, or all queues summed)",
)
async def get_history(
    request: Request,
    queue: Annotated[str | None, Query(description="a queue; omit for all queues")] = None,
    seconds: Annotated[int, Query(ge=1, le=86_400, description="how far back")] = 3600,
) -> Response:
    service = service_of(request)
    if queue is not None:
        check_queue_name(queue)
        if queue not in service.engine.list_queues():
            raise QueueNotFound("no such queue", queue=queue)
    return json_response(request.app.state.history.series(queue, seconds))


@router.get("/session", response_model=SessionOut, summary="What this request's token may do")
async def get_session(request: Request) -> Response:
    settings = request.app.state.settings
    if not (settings.tokens or settings.read_tokens):
        return json_response({"auth": False, "role": "admin"})
    header = request.headers.get("authorization", "").encode()
    who = role(
        header,
        tuple(t.encode() for t in settings.tokens),
        tuple(t.encode() for t in settings.read_tokens),
    )
    return json_response({"auth": True, "role": who or "none"})


@router.get("/server", response_model=ServerOut, summary="Version, storage and clients")
async def get_server(request: Request) -> Response:
    service = service_of(request)
    info = await asyncio.to_thread(server_info, request.app, service)
    return json_response(info)


def server_info(app: Any, service: Any) -> dict[str, Any]:
    """What the server view shows (runs in a worker thread: stats take queue locks)."""
    engine, settings = service.engine, service.settings
    queues = []
    for name in engine.list_queues():
        try:
            s = engine.stats(name)
        except StorageError:
            continue
        queues.append(
            {
                "name": name,
                "segments": s.segments,
                "frozen": int(s.extra.get("frozen", 0)),
                "bytes_on_disk": s.bytes_on_disk,
            }
        )
    queues.sort(key=lambda q: (-q["bytes_on_disk"], q["name"]))
    disk = shutil.disk_usage(engine.root)
    started: float = app.state.started_at
    shm = getattr(app.state, "shm", None)
    return {
        "version": _version(),
        "data_dir": os.path.abspath(engine.root),
        "fsync": settings.fsync,
        "fsync_interval_ms": settings.fsync_interval_ms,
        "started_at": int(started * 1000),
        "uptime_ms": int((time.time() - started) * 1000),
        "auth": bool(settings.tokens or settings.read_tokens),
        "queue_count": len(queues),
        "data_bytes": sum(q["bytes_on_disk"] for q in queues),
        "disk": {"total": disk.total, "used": disk.used, "free": disk.free},
        "queues": queues,
        "shm": {
            "enabled": shm is not None,
            "clients": shm.clients() if shm is not None and hasattr(shm, "clients") else [],
        },
        "history": app.state.history.describe(),
    }
