"""The client's HTTP/1.1 reading: the one-call reading of a plain answer agrees with the
full parser, and an answer is read the same however the network splits it."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from dq.client import _connection
from dq.client._connection import Connection, Lost, Response, ResponseParser, whole_answer

BODY = b'{"items":[{"id":9801,"deadline":1795405631034,"duplicate":false}]}'
PLAIN = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 23 Nov 2026 03:47:10 GMT\r\ncontent-length: 66\r\n"
    b"content-type: application/json\r\n\r\n" + BODY
)
#: answers of every shape the parser takes, each with what it must read from them
ANSWERS: list[tuple[bytes, Response]] = [
    (PLAIN, Response(200, BODY, False)),
    (PLAIN + b"HTTP/1.1 200 OK\r\n", Response(200, BODY, False)),  # bytes after: ignored
    (b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}", Response(404, b"{}", False)),
    (b"HTTP/1.1 200 OK\r\nCONTENT-LENGTH:\t3 \r\nX-A: b\r\n\r\nabc", Response(200, b"abc", False)),
    (b"HTTP/1.1 200 OK\r\n Content-Length : 3\r\n\r\nabc", Response(200, b"abc", False)),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Response(200, b"", False)),
    (b"HTTP/1.1 204 No Content\r\ncontent-length: 9\r\n\r\n", Response(204, b"", False)),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok", Response(200, b"ok", True)),
    (b"HTTP/1.1 200 OK\r\nConnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", Response(200, b"ok", False)),
    (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", Response(200, b"ok", True)),
    (b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok", Response(200, b"ok", False)),
    (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\nok", Response(201, b"ok", False)),
    (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 99\r\n\r\n2\r\nok\r\n1;x=y\r\n!\r\n0\r\n\r\n", Response(200, b"ok!", False)),
    (b"HTTP/1.1 200 OK\r\nx-content-length: 7\r\ncontent-length: 2\r\n\r\nok", Response(200, b"ok", False)),
    (b"HTTP/1.1 200 OK\r\nx-note: connection\r\ncontent-length: 2\r\n\r\nok", Response(200, b"ok", False)),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nx-empty:\r\n\r\nok\r\n\r\ncontent-length: 9", Response(200, b"ok", False)),
]  # fmt: skip
#: answers that cannot be read: the connection is given up (``Lost``)
BROKEN = [
    b"HTTP/1.1 2x0 OK\r\ncontent-length: 2\r\n\r\nok",
    b"http/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\ncontent-length: two\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nok\r\n0\r\n\r\n",
]


def _parsed(data: bytes) -> Response | None:
    return ResponseParser().feed(data)


@pytest.mark.parametrize(("data", "expected"), ANSWERS)
def test_the_parser_reads_every_shape(data: bytes, expected: Response) -> None:
    assert _parsed(data) == expected


@pytest.mark.parametrize(("data", "expected"), ANSWERS)
def test_the_one_call_reading_agrees_with_the_parser(data: bytes, expected: Response) -> None:
    """``whole_answer`` reads an answer as the parser does, or leaves it to the parser."""
    quick = whole_answer(data)
    assert quick is None or quick == expected
    for cut in range(len(data)):  # an answer not all there yet is never taken as whole
        part = whole_answer(data[:cut])
        assert part is None or part == _parsed(data[:cut])


def test_dq_servers_answers_are_read_in_one_call() -> None:
    assert whole_answer(PLAIN) == Response(200, BODY, False)
    head = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\ncontent-type: x\r\n\r\n"
    assert whole_answer(head + b"{}") == Response(503, b"{}", False)
    assert whole_answer(head.replace(b"1.1", b"1.0") + b"{}") is None  # closes: the parser
    assert (
        whole_answer(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok") is None
    )
    assert (
        whole_answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\nok") is None
    )


@pytest.mark.parametrize("data", BROKEN)
def test_broken_answers_are_lost(data: bytes) -> None:
    assert whole_answer(data) is None
    with pytest.raises(Lost):
        _parsed(data)


class _Replay:
    """A socket whose receives return ``parts`` in turn, then end of stream; sends are
    kept. It holds a real descriptor, idle, for the connection's readiness check."""

    def __init__(self, parts: list[bytes]) -> None:
        self._parts = list(parts)
        self._pair = socket.socketpair()
        self.sent: list[bytes] = []

    def fileno(self) -> int:
        return self._pair[0].fileno()

    def setsockopt(self, *args: object) -> None:
        pass

    def settimeout(self, timeout: float | None) -> None:
        pass

    def sendall(self, data: bytes) -> None:
        self.sent.append(data)

    def recv(self, size: int) -> bytes:
        assert size > 0
        return self._parts.pop(0) if self._parts else b""

    def close(self) -> None:
        for end in self._pair:
            end.close()


def _connect(monkeypatch: pytest.MonkeyPatch, replay: _Replay) -> Connection:
    monkeypatch.setattr(_connection, "open_socket", lambda address, timeout: replay)
    return Connection("127.0.0.1", 1, 5.0)


def _cuts(data: bytes) -> Iterator[list[bytes]]:
    yield [data]
    for cut in range(1, len(data)):
        yield [data[:cut], data[cut:]]
    yield [data[i : i + 1] for i in range(len(data))]


@pytest.mark.parametrize(("data", "expected"), ANSWERS)
def test_an_answer_split_anywhere_is_read_the_same(
    data: bytes, expected: Response, monkeypatch: pytest.MonkeyPatch
) -> None:
    for parts in _cuts(data):
        replay = _Replay(parts)
        conn = _connect(monkeypatch, replay)
        try:
            assert conn.request(b"GET / HTTP/1.1\r\n\r\n", 5.0) == expected
            assert replay.sent == [b"GET / HTTP/1.1\r\n\r\n"]
            assert conn.usable() is not expected.close  # kept only if the server keeps it
        finally:
            conn.close()


@pytest.mark.parametrize("data", [a for a, r in ANSWERS if not r.close])
def test_an_answer_cut_short_is_lost(data: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    end = data.index(b"\r\n\r\n") + 4  # a status line and headers, then no (whole) body
    for cut in range(0, len(data)):
        if cut >= end and _parsed(data[:cut]) is not None:
            continue  # complete already (a body of 0 bytes, bytes after it)
        conn = _connect(monkeypatch, _Replay([data[:cut]] if cut else []))
        with pytest.raises(Lost):
            conn.request(b"GET / HTTP/1.1\r\n\r\n", 5.0)
        assert not conn.usable()


@pytest.mark.parametrize(("data", "expected"), ANSWERS)
def test_the_async_protocol_reads_an_answer_split_anywhere(data: bytes, expected: Response) -> None:
    async def read(parts: list[bytes]) -> Response:
        protocol = _connection._Protocol()
        protocol.waiter = asyncio.get_running_loop().create_future()
        for part in parts:
            buffer = protocol.get_buffer(-1)
            buffer[: len(part)] = part
            protocol.buffer_updated(len(part))
        return await asyncio.wait_for(protocol.waiter, 5)

    async def main() -> None:
        for parts in _cuts(data):
            assert await read(parts) == expected

    asyncio.run(main())
