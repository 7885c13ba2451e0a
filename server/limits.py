"""Request body limit, as a pure ASGI middleware (no per-request task or buffering).

A declared ``Content-Length`` above the limit is refused before the body is read;
a chunked body is counted as it streams and refused when it crosses the limit.
Invariant: the refusal is always the JSON error shape (``body_too_large``, 413).
"""

from __future__ import annotations

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dq.server.errors import error_response

__all__ = ["BodyLimit"]


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is larger than {limit} bytes")


class BodyLimit:
    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit() or int(value) > limit:
                    message = f"the request body is larger than {limit} bytes"
                    await error_response(413, "body_too_large", message)(scope, receive, send)
                    return
                break
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, limited, sending)
        except BodyTooLarge as exc:
            # Raised in a middleware that reads the body itself (outside the app's
            # exception handlers): answer here, unless an answer has begun.
            if started:
                raise
            await error_response(413, "body_too_large", str(exc.detail))(scope, receive, send)
