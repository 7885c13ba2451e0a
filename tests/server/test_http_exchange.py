"""``Exchange``: a request handed to an ASGI app, and the bytes its answer becomes.

The connection is a stand-in that records what is written (the protocol's part —
parsing, pipelining, limits — is tested over real sockets in ``test_known_heads.py``,
``test_hot_path.py`` and ``test_hostile_input.py``); the app is a plain ASGI callable.
What is checked is what uvicorn's protocol wrote for the same messages, which the
dashboard, SQS and every non-hot route rely on: ``Content-Length`` or chunked bodies,
``HEAD``, ``connection: close``, ``100 Continue``, and a failing app.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dq.server.http_exchange import Exchange

App = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


class Transport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


class ServerState:
    default_headers = [(b"date", b"Fri, 27 Nov 2026 12:00:00 GMT")]


class Connection:
    """What an ``Exchange`` asks of its connection (``server/protocol.py``)."""

    def __init__(self) -> None:
        self.transport = Transport()
        self.server_state = ServerState()
        self.writes_paused = False
        self.done = 0
        self.logged: list[int] = []

    def resume_reading(self) -> None:
        pass

    def log_access(self, scope: dict[str, Any], status: int) -> None:
        self.logged.append(status)

    def response_done(self) -> None:
        self.done += 1


def _exchange(
    method: str = "GET", keep_alive: bool = True, expect_100: bool = False
) -> tuple[Exchange, Connection]:
    conn = Connection()
    scope = {"type": "http", "method": method, "path": "/x", "headers": []}
    return Exchange(conn, scope, keep_alive, expect_100), conn  # type: ignore[arg-type]


def _answer(body: bytes, headers: list[tuple[bytes, bytes]], *more: bytes) -> App:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in more:
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": body})

    return app


DATE = b"date: Fri, 27 Nov 2026 12:00:00 GMT\r\n"


def test_a_body_of_known_length_is_written_after_its_headers() -> None:
    exchange, conn = _exchange()
    asyncio.run(exchange.run(_answer(b"hi", [(b"content-length", b"2")])))
    assert conn.transport.written == b"HTTP/1.1 200 OK\r\n" + DATE + b"content-length: 2\r\n\r\nhi"
    assert (conn.done, conn.transport.closed, conn.logged) == (1, False, [200])


def test_a_body_of_unknown_length_is_chunked_but_not_for_head() -> None:
    exchange, conn = _exchange()
    asyncio.run(exchange.run(_answer(b"", [], b"ab", b"cde")))
    assert conn.transport.written == (
        b"HTTP/1.1 200 OK\r\n" + DATE + b"transfer-encoding: chunked\r\n\r\n"
        b"2\r\nab\r\n3\r\ncde\r\n0\r\n\r\n"
    )
    exchange, conn = _exchange("HEAD")
    asyncio.run(exchange.run(_answer(b"ignored", [(b"content-length", b"7")])))
    assert conn.transport.written == b"HTTP/1.1 200 OK\r\n" + DATE + b"content-length: 7\r\n\r\n"


def test_a_connection_that_ends_says_so_and_closes_after_the_answer() -> None:
    exchange, conn = _exchange(keep_alive=False)
    asyncio.run(exchange.run(_answer(b"x", [(b"content-length", b"1")])))
    assert conn.transport.written.endswith(b"content-length: 1\r\nconnection: close\r\n\r\nx")
    assert conn.transport.closed and conn.done == 1
    # the app may end it too
    exchange, conn = _exchange()
    asyncio.run(exchange.run(_answer(b"", [(b"content-length", b"0"), (b"connection", b"close")])))
    assert conn.transport.written.count(b"connection: close") == 1 and conn.transport.closed


def test_the_body_is_received_as_it_came_then_the_end() -> None:
    exchange, _ = _exchange("POST", expect_100=True)
    got: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        got.append(await receive())
        got.append(await receive())
        await _answer(b"", [(b"content-length", b"0")])(scope, receive, send)
        got.append(await receive())  # answered: the client is as good as gone

    async def run() -> None:
        task = asyncio.ensure_future(exchange.run(app))
        exchange.body += b"part one"
        exchange.message_event.set()
        await asyncio.sleep(0.01)
        exchange.body += b", two"
        exchange.more_body = False
        exchange.message_event.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(run())
    assert got == [
        {"type": "http.request", "body": b"part one", "more_body": True},
        {"type": "http.request", "body": b", two", "more_body": False},
        {"type": "http.disconnect"},
    ]
    assert exchange.protocol.transport.written.startswith(b"HTTP/1.1 100 Continue\r\n\r\n")  # type: ignore[attr-defined]


def test_an_app_that_fails_before_answering_is_answered_500_in_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(scope: dict[str, Any], receive: Any, send: Any) -> None:
        raise RuntimeError("a bug")

    exchange, conn = _exchange()
    asyncio.run(exchange.run(broken))
    head, _, body = conn.transport.written.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"connection: close" in head and conn.transport.closed
    assert json.loads(body)["error"] == "internal_error"
    assert "Exception in ASGI application" in caplog.text


def test_an_app_that_fails_while_answering_has_its_connection_closed() -> None:
    async def half(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("a bug")

    exchange, conn = _exchange()
    asyncio.run(exchange.run(half))
    assert conn.transport.closed and conn.done == 0
