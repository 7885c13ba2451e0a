"""One request handed to the ASGI app, and its response written to the connection.

Every request the fast path does not answer (``server/hot_routes.py``) — the dashboard,
the admin routes, SQS, and every hot request it declines — reaches the FastAPI app
through the ASGI interface alone: a scope, a ``receive`` that hands out the body as it
arrives (``http.request`` messages, then ``http.disconnect`` once the client has gone
or the response is complete), and a ``send`` that writes the ``http.response.start``
and ``http.response.body`` messages as HTTP/1.1 (status line, the server's default
headers — ``date`` —, the app's headers, a body of ``Content-Length`` or chunked). The
connection (``server/protocol.py``) owns the parser and the socket; an exchange only
writes its own response, and tells the connection when it is complete.

It does what uvicorn's httptools protocol did for the same app, byte for byte, so that
answers did not change when the protocol became ours: ``100 Continue`` before the first
``receive`` of a request that expects it, ``connection: close`` when the request or the
app ends the connection, no body for ``HEAD``, writes paused while the socket's buffer
is full, and a failed app logged — answered 500 if it had not begun its answer, the
connection closed if it had.
"""

from __future__ import annotations

import asyncio
import http
import logging
import re
from typing import Any, Protocol

from dq.server.errors import INTERNAL_ERROR, error_json

__all__ = ["HIGH_WATER", "STATUS_LINE", "Connection", "Exchange"]

logger = logging.getLogger("uvicorn.error")


def _status_line(status: int) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase.encode()
    except ValueError:
        phrase = b""
    return b"HTTP/1.1 %d %s\r\n" % (status, phrase)


#: ``HTTP/1.1 200 OK\r\n`` ... by status.
STATUS_LINE = {status: _status_line(status) for status in range(100, 600)}
#: Body bytes held for the app before the connection stops reading.
HIGH_WATER = 65536
_HEADER_NAME = re.compile(b'[\x00-\x1f\x7f()<>@,;:\\[\\]={} \t\\\\"]')
_HEADER_VALUE = re.compile(b"[\x00-\x08\x0a-\x1f\x7f]")


class Connection(Protocol):
    """What an exchange asks of its connection (``server/protocol.py: DqHttpProtocol``)."""

    transport: asyncio.Transport
    #: uvicorn's ``ServerState``: ``default_headers`` (the ``date`` line) is read here
    server_state: Any
    #: the socket's buffer is full: ``send`` waits for ``drained``
    writes_paused: bool

    async def drained(self) -> None: ...
    def resume_reading(self) -> None: ...
    def log_access(self, scope: dict[str, Any], status: int) -> None: ...
    def response_done(self) -> None:
        """The response is complete: the next request on the connection may start."""


class Exchange:
    """One request for the ASGI app: its scope, its body as it arrives, its response."""

    __slots__ = (
        "body",
        "chunked",
        "disconnected",
        "keep_alive",
        "left",
        "message_event",
        "more_body",
        "protocol",
        "response_complete",
        "response_started",
        "scope",
        "waiting_for_100_continue",
    )

    def __init__(
        self,
        protocol: Connection,
        scope: dict[str, Any],
        keep_alive: bool,
        expect_100_continue: bool = False,
    ) -> None:
        self.protocol = protocol
        self.scope = scope
        self.keep_alive = keep_alive
        self.waiting_for_100_continue = expect_100_continue
        #: the body as it arrives, until ``receive`` hands it out
        self.body: bytes | bytearray = bytearray()
        self.more_body = True
        self.message_event = asyncio.Event()
        self.disconnected = False
        self.response_started = self.response_complete = False
        self.chunked: bool | None = None
        #: body bytes the response still owes its ``Content-Length``
        self.left = 0

    async def run(self, app: Any) -> None:
        """Call the app; a failure is logged, and answered as well as it still can be."""
        try:
            result = await app(self.scope, self.receive, self.send)
        except BaseException as exc:
            logger.error("Exception in ASGI application\n", exc_info=exc)
            if not self.response_started:
                await self._send_500()
            else:
                self.protocol.transport.close()
        else:
            if result is not None:
                logger.error("ASGI callable should return None, but returned '%s'.", result)
                self.protocol.transport.close()
            elif not self.response_started and not self.disconnected:
                logger.error("ASGI callable returned without starting response.")
                await self._send_500()
            elif not self.response_complete and not self.disconnected:
                logger.error("ASGI callable returned without completing response.")
                self.protocol.transport.close()

    async def _send_500(self) -> None:
        body = error_json(*INTERNAL_ERROR)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", b"%d" % len(body)),
            (b"connection", b"close"),
        ]
        await self.send({"type": "http.response.start", "status": 500, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    # ------------------------------------------------------------------ ASGI

    async def receive(self) -> dict[str, Any]:
        protocol = self.protocol
        if self.waiting_for_100_continue and not protocol.transport.is_closing():
            protocol.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            self.waiting_for_100_continue = False
        if not self.disconnected and not self.response_complete:
            protocol.resume_reading()
            await self.message_event.wait()
            self.message_event.clear()
        if self.disconnected or self.response_complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body = bytearray()
        return message

    async def send(self, message: dict[str, Any]) -> None:
        protocol = self.protocol
        if protocol.writes_paused and not self.disconnected:
            await protocol.drained()
        if self.disconnected:
            return
        if not self.response_started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"Expected 'http.response.start', got '{message['type']}'.")
            self._start(message["status"], message.get("headers", ()))
        elif not self.response_complete:
            if message["type"] != "http.response.body":
                raise RuntimeError(f"Expected 'http.response.body', got '{message['type']}'.")
            self._body(message.get("body", b""), message.get("more_body", False))
        else:
            raise RuntimeError(f"Unexpected '{message['type']}' after the response completed.")

    def _start(self, status: int, app_headers: Any) -> None:
        """The status line and headers, as one write."""
        self.response_started = True
        self.waiting_for_100_continue = False
        protocol = self.protocol
        protocol.log_access(self.scope, status)
        content = [STATUS_LINE[status]]
        closes = False
        for name, value in (*protocol.server_state.default_headers, *app_headers):
            if _HEADER_NAME.search(name):
                raise RuntimeError("Invalid HTTP header name.")
            if _HEADER_VALUE.search(value):
                raise RuntimeError("Invalid HTTP header value.")
            name = name.lower()
            if name == b"content-length" and self.chunked is None:
                self.left = int(value.decode())
                self.chunked = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.left = 0
                self.chunked = True
            elif name == b"connection" and b"close" in [
                token.lower().strip() for token in value.split(b",")
            ]:
                self.keep_alive = False
                closes = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not closes:
            content.append(b"connection: close\r\n")
        if self.chunked is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked = True  # neither a length nor an encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        protocol.transport.write(b"".join(content))

    def _body(self, body: bytes, more_body: bool) -> None:
        transport = self.protocol.transport
        if self.scope["method"] == "HEAD":
            self.left = 0
        elif self.chunked:
            content = [b"%x\r\n" % len(body), body, b"\r\n"] if body else []
            if not more_body:
                content.append(b"0\r\n\r\n")
            transport.write(b"".join(content))
        else:
            if len(body) > self.left:
                raise RuntimeError("Response content longer than Content-Length")
            self.left -= len(body)
            transport.write(body)
        if not more_body:
            if self.left != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                transport.close()
            self.protocol.response_done()
