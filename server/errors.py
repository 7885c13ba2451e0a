"""The one place where errors become HTTP responses.

Every error the service returns is JSON ``{"error": code, "message": text}`` with a
stable ``code``: storage errors keep their own ``code`` and answer their class's
``http_status`` (declared in ``storage/errors.py``, beside the error tree); request
validation errors are ``validation_error`` (422) or ``invalid_json`` (400); the HTTP
layer's own refusals (``unauthorized``, ``body_too_large``, ``not_found`` ...) are
``ApiError``. The FastAPI handlers and the HTTP fast path (``server/hot_routes.py``)
both render through ``storage_error_reply`` and ``error_json``, so an error answer is
the same bytes whichever path served it. Invariant: bad input never yields a 500 —
only an unexpected bug does, and it is logged.

A follower of a replicated deployment refuses writes and dequeues before doing anything
(the engine's ``NotLeader``): ``421 {"error": "not_leader", "message": ..., "leader":
url}`` with the header ``X-DQ-Leader: url``, or, while no leader is known, ``503
{"error": "no_leader", ...}`` with ``Retry-After: 1``. Clients re-send such a request to
the leader whatever it was (``docs/http.md``, "Replication").
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from dq.storage.errors import (
    BrokenRule,
    EngineUnavailable,
    NotLeader,
    StorageError,
    status_for_code,
)
from dq.storage.validation import RANGES

__all__ = [
    "LEADER_HEADER",
    "ApiError",
    "allowed_methods",
    "as_storage_error",
    "error_json",
    "error_response",
    "header_lines",
    "install_error_handlers",
    "item_status",
    "status_for",
    "storage_error_reply",
]

logger = logging.getLogger(__name__)

_JSON = "application/json"
#: the header naming the leader on a follower's 421
LEADER_HEADER = "X-DQ-Leader"
_RETRY = {"Retry-After": "1"}

_HTTP_CODES: dict[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}


class ApiError(Exception):
    """A refusal decided by the HTTP layer itself (auth, limits, routing)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: list[dict[str, object]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers
        #: per-problem ``loc``/``msg``/``type`` of a ``validation_error``, as pydantic's
        self.details = details


def status_for(exc: StorageError) -> int:
    return exc.http_status


def item_status(code: str) -> int:
    """The status a single-item route answers for its item's error ``code``."""
    status = status_for_code(code)
    return status if status < 500 else 400


def as_storage_error(exc: BaseException) -> StorageError:
    """What an engine call's failure answers: an ``OSError`` that escaped the engine
    (a failed write or fsync) means the queue can no longer be trusted: 503."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, OSError):
        return EngineUnavailable(f"I/O error: {exc}")
    raise exc


def error_json(
    code: str,
    message: str,
    leader: str | None = None,
    details: list[dict[str, object]] | None = None,
) -> bytes:
    """The error body, byte for byte what ``JSONResponse`` renders for it."""
    doc: dict[str, object] = {"error": code, "message": message}
    if leader is not None:
        doc["leader"] = leader
    if details is not None:
        doc["details"] = details
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def storage_error_reply(exc: StorageError, where: str) -> tuple[int, bytes, dict[str, str] | None]:
    """(status, body, headers) for a storage error; 5xx are logged here, once: as an
    error, or as a warning when the error's class says it is ``expected`` (a replica
    group's commit that timed out or stalled during a failover is answered in full and
    needs no one's attention). A follower's refusal is routine: not logged."""
    if isinstance(exc, NotLeader):
        if exc.leader:
            return 421, error_json("not_leader", str(exc), exc.leader), {LEADER_HEADER: exc.leader}
        return 503, error_json("no_leader", str(exc)), _RETRY
    status = exc.http_status
    if status >= 500:
        level = logging.WARNING if exc.expected else logging.ERROR
        logger.log(level, "storage error on %s: %s: %s", where, exc.code, exc)
    if isinstance(exc, BrokenRule):  # a validation error: its problem, as the schema's are
        details: list[dict[str, object]] = [
            {"loc": ["body", exc.field], "msg": str(exc), "type": "value_error"}
        ]
        return status, error_json(exc.code, str(exc), details=details), None
    return status, error_json(exc.code, str(exc)), _RETRY if status == 503 else None


def header_lines(headers: dict[str, str] | None) -> bytes:
    """``headers`` as the lines Starlette writes them (names lower-cased), for the fast
    path's answers; ``b""`` for none."""
    if not headers:
        return b""
    return b"".join(
        b"%s: %s\r\n" % (k.lower().encode(), v.encode("latin-1")) for k, v in headers.items()
    )


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        error_json(code, message), status_code=status, headers=headers, media_type=_JSON
    )


async def _storage_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StorageError)
    where = f"{request.method} {request.url.path}"
    status, body, headers = storage_error_reply(exc, where)
    return Response(body, status_code=status, headers=headers, media_type=_JSON)


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    if exc.details is not None:
        body = {"error": exc.code, "message": exc.message, "details": exc.details}
        return JSONResponse(body, status_code=exc.status, headers=exc.headers)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "invalid_json", "the request body is not valid JSON")
    if any(
        e.get("type") == "model_attributes_type" and tuple(e.get("loc", ())) == ("body",)
        for e in errors
    ):  # a body that was not parsed as JSON: usually a missing Content-Type
        message = (
            "body: send a JSON object with the header Content-Type: application/json"
            f" (got {request.headers.get('content-type') or 'no Content-Type'})"
        )
        return JSONResponse(
            {"error": "validation_error", "message": message, "details": _details(errors)},
            status_code=422,
        )
    return JSONResponse(
        {"error": "validation_error", "message": _summarize(errors), "details": _details(errors)},
        status_code=422,
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": _allowed(request)}
    elif exc.status_code == 400 and exc.detail == _UNPARSED:
        # JSON the parser gives up on: nested too deep, or a number of thousands of digits
        message = (
            "the request body could not be read as JSON (nested too deep, or a number too long)"
        )
        return error_response(400, "invalid_json", message)
    return error_response(exc.status_code, code, str(exc.detail), headers)


#: FastAPI's 400 for a body its JSON parser failed on other than by a syntax error.
_UNPARSED = "There was an error parsing the body"


#: The methods a 405's ``Allow`` may name.
_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def _allowed(request: Request) -> str:
    """Every method the request's path answers. Each method of a path is a route of
    its own (``GET``, ``PUT`` and ``DELETE /v1/queues/{queue}``), and the router's 405
    names the methods of the first one only."""
    return ", ".join(allowed_methods(request))


def allowed_methods(request: Request) -> list[str]:
    """The methods dq's routes serve at the request's path. A route taking every method
    is a catch-all (the SQS queue URL ``/{account}/{queue}``, which answers 404 to what
    is not SQS): it is no route of the path's own."""
    scopes = [{**request.scope, "method": method} for method in _METHODS]
    allowed: set[str] = set()
    for route in request.app.router.routes:
        serves = [
            m
            for m, scope in zip(_METHODS, scopes, strict=True)
            if route.matches(scope)[0] is Match.FULL
        ]
        if len(serves) < len(_METHODS):
            allowed.update(serves)
    return [m for m in _METHODS if m in allowed]


#: What a request that met a bug is answered (details go to the server log only).
INTERNAL_ERROR = ("internal_error", "internal server error (see the server log)")


async def _unexpected(request: Request, exc: Exception) -> Response:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, *INTERNAL_ERROR)


#: pydantic's error types for a value outside its field's bounds
_BOUND_TYPES = frozenset(
    {
        "greater_than",
        "greater_than_equal",
        "less_than",
        "less_than_equal",
        "string_too_short",
        "string_too_long",
    }
)


def _rule_message(e: Any) -> str | None:
    """The rule's own words for a bound a field broke, if the field has a rule
    (``storage/validation.py``): the ring, the engine and the client say the same."""
    loc = e.get("loc", ())
    if e.get("type") in _BOUND_TYPES and loc and loc[-1] in RANGES:
        return RANGES[loc[-1]].message
    return None


def _where(loc: Any) -> list[str]:
    """Where a problem is, without the framework's ``body`` in front."""
    parts = [str(p) for p in loc]
    return parts[1:] if len(parts) > 1 and parts[0] == "body" else parts


def _summarize(errors: list[Any]) -> str:
    parts = []
    for e in errors[:5]:
        where = _where(e.get("loc", ()))
        rule = _rule_message(e)
        if rule is None:
            parts.append(f"{'.'.join(where)}: {e.get('msg', 'invalid')}")
        elif len(where) > 1:  # a field of a batch's item: name the item
            parts.append(f"{'.'.join(where[:-1])}: {rule}")
        else:
            parts.append(rule)
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def _details(errors: list[Any]) -> list[dict[str, object]]:
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": _rule_message(e) or str(e.get("msg", "")),
            "type": str(e.get("type", "")),
        }
        for e in errors[:20]
    ]


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StorageError, _storage_error)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)
