"""Routes of the items a key names: ``/v1/queues/{queue}/keys/{key}``.

``GET`` peeks the item the key names, ``DELETE`` cancels it if it is pending, ``PATCH``
gives it a new deadline and/or value if it is pending. The rules — a leased item is
409 ``item_leased`` and nothing changes, a gone one 404 ``item_not_found``, a key past
its window 404 ``key_not_found`` — are the engine's (``storage/keyops.py``, through
``storage/itemops.py``); each call runs in a worker thread (``in_thread``: it may read
a block of a segment file, and a write waits for its fsync). A key may hold ``/``: the
route takes the rest of the path as the key (``server/path_guard.py`` lets its escaped
slashes through).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from dq.server.dependencies import QueuePath, service_of
from dq.server.errors import ApiError
from dq.server.routers._common import (
    ERRORS,
    EncodingQuery,
    ValueQuery,
    in_thread,
    json_response,
)
from dq.server.routers.operate import item_json
from dq.server.schemas import (
    KeyCancelled,
    KeyedItemOut,
    KeyMoved,
    KeyPatch,
    decode_value,
)

__all__ = ["router"]

router = APIRouter(prefix="/v1/queues/{queue}/keys", tags=["keys"], responses=ERRORS)
KeyPath = Annotated[
    str, Path(description="the item's key (1-128 bytes of UTF-8; a '/' in it may be sent as is)")
]


@router.get(
    "/{key:path}",
    response_model=KeyedItemOut,
    summary="The item a key names, wherever it is (state 'gone' once it left the queue)",
)
async def peek_key(
    queue: QueuePath,
    key: KeyPath,
    request: Request,
    values: ValueQuery = True,
    encoding: EncodingQuery = None,
) -> Response:
    service = service_of(request)
    item = await in_thread(service, "key_get", lambda: service.ops.peek_key(queue, key, values), 1)
    return json_response({**item_json(item, encoding), "key": key})


@router.delete(
    "/{key:path}",
    response_model=KeyCancelled,
    summary="Cancel the pending item a key names (409 item_leased if a consumer has it)",
)
async def cancel_key(queue: QueuePath, key: KeyPath, request: Request) -> Response:
    service = service_of(request)
    item_id = await in_thread(service, "key_cancel", lambda: service.ops.cancel_key(queue, key), 1)
    return json_response({"cancelled": item_id, "key": key})


@router.patch(
    "/{key:path}",
    response_model=KeyMoved,
    summary="Reschedule (deadline or delay_ms) and/or replace the value of the pending "
    "item a key names (409 item_leased if a consumer has it)",
)
async def patch_key(queue: QueuePath, key: KeyPath, body: KeyPatch, request: Request) -> Response:
    service = service_of(request)
    value = None
    if body.value is not None:
        try:
            value = decode_value(body.value, body.encoding)
        except (ValueError, UnicodeEncodeError) as exc:
            raise ApiError(422, "validation_error", f"value: {exc}") from None
    done = await in_thread(
        service,
        "key_patch",
        lambda: service.ops.patch_key(
            queue, key, deadline=body.deadline, delay_ms=body.delay_ms, value=value
        ),
        1,
    )
    return json_response({"id": done.id, "deadline": done.deadline, "key": key})
