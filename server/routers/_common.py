"""Helpers shared by the routers: JSON responses, error docs, a single item's answer,
engine calls in a worker thread, and the parameters several routes take (an item's id
in the path; a peek's ``values`` and ``encoding``), described once so that the OpenAPI
document says the same of each wherever it appears.

Invariant: every route documents the error statuses it can answer (``ERRORS``), so
the OpenAPI document is a complete contract (schemathesis checks it).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypeVar

from fastapi import Path, Query, Response

from dq.server.answers import outcome_dict
from dq.server.dependencies import Service
from dq.server.errors import error_response, item_status
from dq.server.schemas import Encoding, ErrorBody
from dq.storage.codec import MAX_ID
from dq.storage.errors import StorageError
from dq.storage.types import ItemOutcome

__all__ = [
    "ERRORS",
    "EncodingQuery",
    "ItemIdPath",
    "ValueQuery",
    "in_thread",
    "json_response",
    "single_outcome",
]

_perf = time.perf_counter
T = TypeVar("T")

_DESCRIPTIONS = {
    400: "Bad input (invalid queue name, receipt, deadline, malformed JSON)",
    401: "Missing or wrong bearer token (only when DQ_TOKENS is set)",
    403: "A read-only token (DQ_READ_TOKENS) asked for more than a read",
    404: "Queue or item not found",
    409: "Stale receipt (that delivery is over) or conflicting config",
    413: "Batch, value or body too large",
    421: "This node follows a replicated deployment's leader: send the request to `leader`",
    422: "Request does not match the schema",
    503: "Engine unavailable (starting, stopping or failed), or no leader known yet",
    507: "No space left on the data volume",
}

#: ``responses=`` for every /v1 route.
ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _DESCRIPTIONS.items()
}


#: an item's id in a route's path
ItemIdPath = Annotated[int, Path(ge=0, le=MAX_ID, description="item id")]
#: a peek's ``values``: whether the item's value comes with it (default: it does)
ValueQuery = Annotated[bool, Query(description="include the value")]
#: ``encoding=base64`` answers values in base64 even where they are UTF-8 text
EncodingQuery = Annotated[Encoding | None, Query(description="force base64 values")]


def json_response(content: object, status: int = 200) -> Response:
    """Serialize once with the stdlib: the routes build plain dicts on hot paths."""
    body = json.dumps(content, separators=(",", ":")).encode()
    return Response(body, status_code=status, media_type="application/json")


async def in_thread(service: Service, op: str, call: Callable[[], T], items: int = 0) -> T:
    """``call`` (an engine call that may read segment files or wait for an fsync) in a
    worker thread, so the event loop never blocks on it; its time goes to the metrics as
    ``op`` (with ``items``), or with its error's code when it raises."""
    t0 = _perf()
    try:
        out = await asyncio.to_thread(call)
    except StorageError as exc:
        service.metrics.observe_error(op, exc.code, _perf() - t0)
        raise
    service.metrics.observe(op, _perf() - t0, items)
    return out


def single_outcome(outcomes: Sequence[ItemOutcome]) -> Response:
    """A single-item route answers its item's error with that error's status."""
    o = outcomes[0]
    if o.error is None:
        return json_response(outcome_dict(o))
    status = item_status(o.error)
    return error_response(status, o.error, o.message or o.error)
