"""The one place where errors become HTTP responses.

Every error the service returns is JSON ``{"error": code, "message": text}`` with a
stable ``code``: storage errors keep their own ``code``; request validation errors are
``validation_error`` (422) or ``invalid_json`` (400); the HTTP layer's own refusals
(``unauthorized``, ``body_too_large``, ``not_found`` ...) are ``ApiError``. Invariant:
bad input never yields a 500 — only an unexpected bug does, and it is logged.

    StorageError class        status
    InvalidArgument           400
    ValueTooLarge             413
    BatchTooLarge             413
    QueueNotFound             404
    ItemNotFound              404
    StaleReceipt              409
    ConfigConflict            409
    StorageFull               507
    EngineUnavailable         503
    DataDirLocked             503
    anything else             500
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from storage.errors import (
    BatchTooLarge,
    ConfigConflict,
    DataDirLocked,
    EngineUnavailable,
    InvalidArgument,
    ItemNotFound,
    QueueNotFound,
    StaleReceipt,
    StorageError,
    StorageFull,
    ValueTooLarge,
)

__all__ = [
    "ITEM_ERROR_STATUS",
    "ApiError",
    "error_response",
    "install_error_handlers",
    "status_for",
]

logger = logging.getLogger(__name__)

#: Most specific classes first: the first ``isinstance`` match wins.
_STATUS: tuple[tuple[type[StorageError], int], ...] = (
    (ValueTooLarge, 413),
    (BatchTooLarge, 413),
    (InvalidArgument, 400),
    (QueueNotFound, 404),
    (ItemNotFound, 404),
    (StaleReceipt, 409),
    (ConfigConflict, 409),
    (StorageFull, 507),
    (EngineUnavailable, 503),
    (DataDirLocked, 503),
)

#: Per-item error codes (``ItemOutcome.error``) to the status a single-item route answers.
ITEM_ERROR_STATUS: dict[str, int] = {
    "stale_receipt": 409,
    "item_not_found": 404,
    "invalid_receipt": 400,
    "invalid_deadline": 400,
    "invalid_argument": 400,
}

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
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers


def status_for(exc: StorageError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status, headers=headers)


async def _storage_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StorageError)
    status = status_for(exc)
    if status >= 500:
        logger.error("storage error on %s %s: %s", request.method, request.url.path, exc)
    headers = {"Retry-After": "1"} if status == 503 else None
    return error_response(status, exc.code, str(exc), headers)


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, exc.headers)


async def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "invalid_json", "the request body is not valid JSON")
    return JSONResponse(
        {"error": "validation_error", "message": _summarize(errors), "details": _details(errors)},
        status_code=422,
    )


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _HTTP_CODES.get(exc.status_code, "http_error")
    headers = dict(exc.headers) if exc.headers else None
    return error_response(exc.status_code, code, str(exc.detail), headers)


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return error_response(500, "internal_error", "internal server error (see the server log)")


def _summarize(errors: list[Any]) -> str:
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()))
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    more = f" (+{len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def _details(errors: list[Any]) -> list[dict[str, object]]:
    return [
        {
            "loc": [str(p) for p in e.get("loc", ())],
            "msg": str(e.get("msg", "")),
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
