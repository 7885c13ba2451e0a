"""Operator routes: pause/resume, browse and peek, purge and delete, redrive, backup.

Each is a thin shell over one ``Engine`` call (``storage/operations.py``). Calls that
read segment files or wait for a durable write run in a worker thread
(``asyncio.to_thread``), so the event loop never blocks on a block read or an fsync.
Items are shaped by ``item_json`` here, for browse and peek alike.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from dq.server.dependencies import QueuePath, service_of
from dq.server.errors import ApiError
from dq.server.routers._common import (
    ERRORS,
    EncodingQuery,
    ItemIdPath,
    ValueQuery,
    in_thread,
    json_response,
)
from dq.server.routers.queues import queue_info
from dq.server.schemas import (
    BackupRequest,
    BackupResponse,
    BrowsedItemOut,
    BrowsePageOut,
    Deleted,
    Encoding,
    ErrorBody,
    Purged,
    QueueInfo,
    RedriveRequest,
    RedriveResponse,
    encode_value,
)
from dq.storage.types import BrowsedItem

__all__ = ["MAX_PREVIEW_BYTES", "item_json", "router", "value_preview"]

#: the longest value preview a browse gives (``value_bytes``): a page of 1,000 previews
#: stays a few MiB whatever the values' sizes
MAX_PREVIEW_BYTES = 4096

router = APIRouter(tags=["operate"], responses=ERRORS)


def value_preview(value: bytes, limit: int) -> tuple[bytes, bool]:
    """The first ``limit`` bytes of ``value``, and whether ``value`` is text. A text value
    is cut at a character boundary, so that its preview is text too; a binary value's
    preview is answered in base64 even where its first bytes happen to be UTF-8."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return value[:limit], False
    end = limit
    while end > 0 and end < len(value) and value[end] & 0xC0 == 0x80:  # a continuation byte
        end -= 1
    return value[:end], True


def item_json(
    i: BrowsedItem, encoding: Encoding | None = None, value_bytes: int | None = None
) -> dict[str, object]:
    out: dict[str, object] = {
        "id": i.id,
        "deadline": i.deadline,
        "state": i.state,
        "stats": None
        if i.stats is None
        else {
            "enqueue_time": i.stats.enqueue_time,
            "requeue_time": i.stats.requeue_time,
            "dequeue_count": i.stats.dequeue_count,
        },
        "value_size": i.value_size,
    }
    if i.value is not None:
        value, text = (
            (i.value, True) if value_bytes is None else value_preview(i.value, value_bytes)
        )
        out["value"], out["encoding"] = encode_value(value, encoding if text else "base64")
    if i.lease_expires is not None:
        out["lease_expires"] = i.lease_expires
    if i.dead_lettered_from is not None:
        out["dead_lettered_from"] = i.dead_lettered_from
    if i.group is not None:
        out["group"] = i.group
    if i.moved_to is not None:
        out["moved_to"] = {"queue": i.moved_to.queue, "id": i.moved_to.id}
    if i.errors:
        out["last_error"], out["last_error_at"] = i.errors[0].error, i.errors[0].at
        out["errors"] = [{"error": r.error, "at": r.at, "delivery": r.delivery} for r in i.errors]
    return out


@router.post(
    "/v1/queues/{queue}/pause",
    response_model=QueueInfo,
    summary="Pause: dequeue hands out nothing until resumed (writes go on)",
)
async def pause(queue: QueuePath, request: Request) -> Response:
    service = service_of(request)
    stats = await in_thread(service, "pause", lambda: service.engine.pause(queue))
    return json_response(queue_info(stats))


@router.post(
    "/v1/queues/{queue}/resume",
    response_model=QueueInfo,
    summary="Resume a paused queue; waiting long-polls wake at once",
)
async def resume(queue: QueuePath, request: Request) -> Response:
    service = service_of(request)
    stats = await in_thread(service, "resume", lambda: service.engine.resume(queue))
    return json_response(queue_info(stats))


@router.get(
    "/v1/queues/{queue}/items",
    response_model=BrowsePageOut,
    summary="Browse items in (deadline, id) order without leasing them",
)
async def browse(
    queue: QueuePath,
    request: Request,
    state: Annotated[
        Literal["all", "due", "delayed", "leased"], Query(description="which items")
    ] = "all",
    after: Annotated[
        str | None, Query(max_length=400, description="the 'next' of the previous page")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="items per page")] = 100,
    values: Annotated[bool, Query(description="include each item's value")] = False,
    encoding: EncodingQuery = None,
    value_bytes: Annotated[
        int | None,
        Query(
            ge=1,
            le=MAX_PREVIEW_BYTES,
            description="with values: only the first this many bytes of each value, a "
            "preview (value_size stays the whole size)",
        ),
    ] = None,
) -> Response:
    service = service_of(request)
    page = await in_thread(
        service,
        "browse",
        lambda: service.engine.browse(queue, state, after, limit, values),
    )
    items = [item_json(i, encoding, value_bytes) for i in page.items]
    return json_response({"items": items, "next": page.next})


@router.get(
    "/v1/queues/{queue}/items/{item_id}",
    response_model=BrowsedItemOut,
    summary="One item by id, wherever it is (state 'gone' once it left the queue)",
)
async def peek(
    queue: QueuePath,
    item_id: ItemIdPath,
    request: Request,
    values: ValueQuery = True,
    encoding: EncodingQuery = None,
) -> Response:
    service = service_of(request)
    item = await in_thread(service, "peek", lambda: service.engine.peek(queue, item_id, values))
    return json_response(item_json(item, encoding))


@router.delete(
    "/v1/queues/{queue}/items",
    response_model=Purged,
    summary="Purge: remove every item, leased ones included (their receipts go stale)",
)
async def purge(queue: QueuePath, request: Request) -> Response:
    service = service_of(request)
    n = await in_thread(service, "purge", lambda: service.engine.purge(queue))
    return json_response({"purged": n})


@router.delete(
    "/v1/queues/{queue}/items/{item_id}",
    response_model=Deleted,
    summary="Remove one item without a receipt",
)
async def delete_item(queue: QueuePath, item_id: ItemIdPath, request: Request) -> Response:
    service = service_of(request)
    await in_thread(service, "delete_item", lambda: service.engine.delete_item(queue, item_id), 1)
    return json_response({"deleted": item_id})


@router.post(
    "/v1/queues/{queue}/redrive",
    response_model=RedriveResponse,
    summary="Move dead letters back to the queue they died in (or 'to'), due now",
)
async def redrive(
    queue: QueuePath, request: Request, body: RedriveRequest | None = None
) -> Response:
    service = service_of(request)
    b = body or RedriveRequest(to=None, ids=None, limit=None)
    result = await in_thread(
        service, "redrive", lambda: service.engine.redrive(queue, b.to, b.ids, b.limit)
    )
    return json_response(
        {
            "moved": result.moved,
            "to": result.to,
            "failed": [
                {"id": f.id, "error": f.error, "message": f.message or f.error}
                for f in result.failed
            ],
        }
    )


def backup_path(root: str, dest: str) -> str:
    """``dest`` inside the server's backup directory: an HTTP client may not make the
    server write anywhere else."""
    if not root:
        raise ApiError(
            403,
            "backup_disabled",
            "backups over HTTP are off: start the server with --backup-dir DIR "
            "(DQ_BACKUP_DIR), or stop it and run `dq backup DEST --data-dir DIR`",
        )
    base = os.path.abspath(root)
    path = os.path.abspath(os.path.join(base, dest))
    if path == base or os.path.commonpath([base, path]) != base:
        raise ApiError(
            400,
            "invalid_argument",
            f"dest must name a new directory inside the backup directory {base}",
        )
    return path


@router.post(
    "/v1/backup",
    response_model=BackupResponse,
    responses={403: {"model": ErrorBody, "description": "Backups over HTTP are off"}},
    summary="Write a consistent copy of the data directory to a new directory on the server",
)
async def backup(body: BackupRequest, request: Request) -> Response:
    service = service_of(request)
    dest = backup_path(service.settings.backup_dir, body.dest)
    result = await in_thread(service, "backup", lambda: service.engine.backup(dest))
    return json_response({"path": result.path, "bytes": result.bytes, "files": result.files})
