"""Hot requests served from a head the parser has read before answer as the parser would.

The protocol (``server/protocol.py``) remembers the head of a hot request the parser
read whole and serves a later read that starts with the same bytes without the parser.
Two in-process servers with the same settings, one with the fast path and one without
(``fast_path=False``: every request through the parser and the framework), get the same
raw bytes over real sockets, sent in the same pieces; their answers must be equal once
the clock and the engine instance are masked, and so must whether they closed the
connection. The cases are the ones where reading without the parser could go wrong:
a request cut across sends at every byte of its head, several requests in one send,
a hot request after another kind on the same connection, HTTP/1.0, ``Connection``,
and heads that differ from a known one by what a parser refuses or treats apart
(duplicate ``Content-Length``, folding, bare LF, bad names, upgrade, absolute form,
``%`` and ``?``), plus the limits (413, 401, 408, the keep-alive timeout).
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.masked import mask
from tests.server.threaded import ThreadedServer, threaded_server

pytestmark = pytest.mark.integration  # in-process servers on 127.0.0.1

TOKEN = "t0ken"
SETTINGS: dict[str, Any] = {
    "tokens": (TOKEN,),
    "max_batch": 5,
    "max_value_bytes": 64,
    "max_body_bytes": 4096,
    "header_timeout_s": 1.0,
    "body_timeout_s": 1.5,
    "shm": False,
    "fsync": "always",
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ThreadedServer, ...]]:
    base: Path = tmp_path_factory.mktemp("dq-heads")
    with (
        threaded_server(base / "fast", **SETTINGS) as fast,
        threaded_server(base / "slow", fast_path=False, **SETTINGS) as slow,
    ):
        yield fast, slow


class Served:
    """Counts the bytes the fast server's connections served without the parser."""

    def __init__(self, server: ThreadedServer, monkeypatch: pytest.MonkeyPatch) -> None:
        cls = server.server.config.http_protocol_class
        self.heads: dict[bytes, Any] = cls.dq_heads
        self.bytes = 0
        inner = cls._serve_known

        def counted(protocol: Any, data: bytes) -> bytes:
            rest: bytes = inner(protocol, data)
            self.bytes += len(data) - len(rest)
            return rest

        monkeypatch.setattr(cls, "_serve_known", counted)

    def at_least(self, n: int, timeout: float = 5.0) -> bool:
        """Whether ``n`` bytes were served so far (the count is updated on the server's
        thread once the answers are written, so a client may read it a moment early)."""
        give_up = time.monotonic() + timeout
        while self.bytes < n and time.monotonic() < give_up:
            time.sleep(0.01)
        return self.bytes >= n


@pytest.fixture
def served(pair: tuple[ThreadedServer, ...], monkeypatch: pytest.MonkeyPatch) -> Served:
    return Served(pair[0], monkeypatch)


def request(
    path: str,
    body: bytes,
    *,
    version: str = "1.1",
    extra: str = "",
    token: str | None = TOKEN,
    ctype: str = "application/json",
    length: int | None = None,
) -> bytes:
    head = f"POST {path} HTTP/{version}\r\nhost: x\r\ncontent-type: {ctype}\r\n"
    head += f"content-length: {len(body) if length is None else length}\r\n"
    if token is not None:
        head += f"authorization: Bearer {token}\r\n"
    return (head + extra + "\r\n").encode() + body


def _j(doc: object) -> bytes:
    return json.dumps(doc).encode()


class Conn:
    """One connection; sends pieces as given and reads whole answers."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, *pieces: bytes, pause: float = 0.0) -> None:
        for n, piece in enumerate(pieces):
            if n and pause:
                time.sleep(pause)
            self.sock.sendall(piece)

    def answer(self, wait: float = 10) -> bytes:
        """One whole answer; what came (maybe ``b""``) if the server closed the
        connection or sent nothing more for ``wait`` seconds."""
        self.sock.settimeout(wait)
        try:
            while b"\r\n\r\n" not in self.buf:
                if not self._more():
                    break
            else:
                head, _, rest = self.buf.partition(b"\r\n\r\n")
                match = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
                length = int(match.group(1)) if match else 0
                while len(rest) < length and self._more():
                    rest = self.buf.partition(b"\r\n\r\n")[2]
                self.buf = rest[length:]
                return mask(head + b"\r\n\r\n" + rest[:length])
        except TimeoutError:
            pass
        finally:
            self.sock.settimeout(10)
        out, self.buf = self.buf, b""
        return mask(out)

    def closed(self, wait: float = 0.5) -> bool:
        """Whether the server closes the connection within ``wait`` seconds."""
        if self.buf:
            return False
        self.sock.settimeout(wait)
        try:
            return not self._more()
        except TimeoutError:
            return False
        finally:
            self.sock.settimeout(10)

    def _more(self) -> bool:
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        self.buf += data
        return bool(data)

    def close(self) -> None:
        self.sock.close()


def both(pair: tuple[ThreadedServer, ...], script: Any) -> list[Any]:
    """``script(conn_factory)`` against each server; the results must be equal."""
    results = []
    for server in pair:
        conns: list[Conn] = []

        def connect(server: ThreadedServer = server, conns: list[Conn] = conns) -> Conn:
            conns.append(Conn(server.port))
            return conns[-1]

        try:
            results.append(script(connect))
        finally:
            for c in conns:
                c.close()
    fast, slow = results
    assert len(fast) == len(slow)
    for n, (a, b) in enumerate(zip(fast, slow, strict=True)):
        assert a == b, f"step {n}:\nfast: {a!r}\nslow: {b!r}"
    return list(fast)


def _learn(conn: Conn, *requests: bytes) -> list[bytes]:
    """Send each request whole, on its own, and read its answer: the fast server
    remembers their heads."""
    out = []
    for r in requests:
        conn.send(r)
        out.append(conn.answer())
    return out


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


# ------------------------------------------------------------------ pieces and batches


def test_a_request_cut_at_every_byte_of_its_head(
    pair: tuple[ThreadedServer, ...], served: Served
) -> None:
    dequeue = request("/v1/queues/cut-none/dequeue", _j({"count": 1}))
    end = dequeue.index(b"\r\n\r\n") + 4

    def script(connect: Any) -> list[bytes]:
        conn = connect()
        out = _learn(conn, dequeue, dequeue)
        for k in range(1, len(dequeue)):
            conn.send(dequeue[:k], dequeue[k:], pause=0.001)
            out.append(conn.answer())
        conn.send(*(dequeue[k : k + 1] for k in range(end)), dequeue[end:])  # byte by byte
        out.append(conn.answer())
        out.append(conn.closed(0.1))
        return out

    out = both(pair, script)
    assert {_status(a) for a in out[:-1]} == {200} and out[-1] is False
    assert served.at_least(len(dequeue))  # the second, at least


def test_enqueues_cut_in_their_body_and_head_keep_every_byte(
    pair: tuple[ThreadedServer, ...], served: Served
) -> None:
    q = "/v1/queues/cut-items"
    values = [f"value-{n:03d}" for n in range(12)]
    bodies = [_j({"items": [{"value": v}]}) for v in values]

    def script(connect: Any) -> list[bytes]:
        conn = connect()
        out = _learn(conn, request(q + "/items", bodies[0]), request(q + "/items", bodies[1]))
        for n, body in enumerate(bodies[2:]):
            r = request(q + "/items", body)
            cut = len(r) - 1 - n * 7  # in the body, then back into the head
            conn.send(r[:cut], r[cut:], pause=0.002)
            out.append(conn.answer())
        out.append(_learn(conn, request(q + "/dequeue", _j({"count": 5})))[0])
        out.append(_learn(conn, request(q + "/dequeue", _j({"count": 5})))[0])
        out.append(_learn(conn, request(q + "/dequeue", _j({"count": 5})))[0])
        return out

    out = both(pair, script)
    got = [v.decode() for a in out[-3:] for v in re.findall(rb'"value":"([^"]*)"', a)]
    assert got == values
    assert served.at_least(1)


def test_several_requests_in_one_send(pair: tuple[ThreadedServer, ...], served: Served) -> None:
    q = "/v1/queues/batched"
    enqueue = [request(q + "/items", _j({"items": [{"value": f"v{n}"}]})) for n in range(4)]
    dequeue = request(q + "/dequeue", _j({"count": 1}))
    empty = request("/v1/queues/batched-none/dequeue", _j({"count": 1}))

    def script(connect: Any) -> list[bytes]:
        conn = connect()
        out = _learn(conn, enqueue[0], empty)
        conn.send(enqueue[1] + enqueue[2] + dequeue)  # two writes waiting to be durable
        out += [conn.answer() for _ in range(3)]
        conn.send(empty + empty + empty)  # answered at once, one after the other
        out += [conn.answer() for _ in range(3)]
        conn.send(empty + enqueue[3][:30])  # a whole one and the start of the next
        out.append(conn.answer())
        conn.send(enqueue[3][30:])
        out.append(conn.answer())
        conn.send(dequeue + request(q + "/items", _j({"items": []})) + dequeue + dequeue)
        out += [conn.answer() for _ in range(4)]
        out.append(conn.closed(0.1))
        return out

    out = both(pair, script)
    assert [_status(a) for a in out[:-1]] == [200] * 11 + [422, 200, 200]
    assert served.at_least(3 * len(empty))


def test_a_hot_request_after_another_kind(pair: tuple[ThreadedServer, ...]) -> None:
    empty = request("/v1/queues/after-none/dequeue", _j({"count": 1}))
    health = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    stats = (
        f"GET /v1/queues/after-none HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
    )

    def script(connect: Any) -> list[bytes]:
        conn = connect()
        out = _learn(conn, empty, health, empty, stats.encode(), empty)
        conn.send(health + empty)
        out += [conn.answer(), conn.answer()]
        conn.send(health + empty + health)
        out += [conn.answer(), conn.answer(), conn.answer()]
        conn.send(stats.encode() + empty)
        out += [conn.answer(), conn.answer()]
        return out

    out = both(pair, script)
    assert [_status(a) for a in out] == [200, 200, 200, 404] + [200] * 6 + [404, 200]


# ------------------------------------------------------------------ the connection


@pytest.mark.parametrize(
    ("variant", "closes"),
    [
        ({"version": "1.0"}, True),
        ({"version": "1.0", "extra": "connection: keep-alive\r\n"}, True),
        ({"extra": "connection: close\r\n"}, True),
        ({"extra": "Connection: Close\r\n"}, True),
        ({"extra": "connection: keep-alive\r\n"}, False),
    ],
    ids=["1.0", "1.0-keep-alive", "close", "Close", "keep-alive"],
)
def test_http_1_0_and_the_connection_header(
    pair: tuple[ThreadedServer, ...], variant: dict[str, str], closes: bool
) -> None:
    path = "/v1/queues/conn-none/dequeue"
    known = request(path, _j({"count": 1}))
    other = request(path, _j({"count": 1}), **variant)  # type: ignore[arg-type]

    def script(connect: Any) -> list[Any]:
        conn = connect()
        out: list[Any] = _learn(conn, known, known, other)
        out.append(conn.closed())
        if not out[-1]:
            out += _learn(conn, known)
        return out

    out = both(pair, script)
    assert out[3] is closes
    assert (b"connection: close" in out[2]) is closes


# ------------------------------------------------------------------ heads a parser refuses


_PATH = "/v1/queues/odd-none/dequeue"
_BODY = _j({"count": 1})
_ODD = {
    "duplicate-length": request(_PATH, _BODY, extra=f"content-length: {len(_BODY)}\r\n"),
    "other-length": request(_PATH, _BODY, extra="content-length: 3\r\n"),
    "length-space": request(_PATH, _BODY).replace(b"length: 12", b"length: 12 "),
    "length-plus": request(_PATH, _BODY).replace(b"length: 12", b"length: +12"),
    "folding": request(_PATH, _BODY, extra="x-a: b\r\n c\r\n"),
    "bare-lf": request(_PATH, _BODY).replace(b"host: x\r\n", b"host: x\n"),
    "bare-cr": request(_PATH, _BODY).replace(b"host: x\r\n", b"host: x\r"),
    "space-in-name": request(_PATH, _BODY, extra="x a: b\r\n"),
    "space-before-colon": request(_PATH, _BODY, extra="x-a : b\r\n"),
    "bad-name": request(_PATH, _BODY, extra="x(a): b\r\n"),
    "tab-value": request(_PATH, _BODY, extra="x-a:\tb\t\r\n"),
    "chunked": request(_PATH, _BODY, extra="transfer-encoding: chunked\r\n"),
    "upgrade": request(_PATH, _BODY, extra="connection: upgrade\r\nupgrade: websocket\r\n"),
    "upgrade-only": request(_PATH, _BODY, extra="upgrade: h2c\r\n"),
    "expect": request(_PATH, _BODY, extra="expect: 100-continue\r\n"),
    "absolute": request("http://x" + _PATH, _BODY),
    "percent": request("/v1/queues/odd%2Dnone/dequeue", _BODY),
    "query": request(_PATH + "?a=b", _BODY),
    "fragment": request(_PATH + "#a", _BODY),
    "lower-method": b"post" + request(_PATH, _BODY)[4:],
    "no-type": request(_PATH, _BODY).replace(b"content-type: application/json\r\n", b""),
    "text-type": request(_PATH, _BODY, ctype="text/plain"),
    "two-types": request(_PATH, _BODY, extra="content-type: text/plain\r\n"),
    "type-case": request(_PATH, _BODY, extra="Content-Type: application/json\r\n"),
    "leading-crlf": b"\r\n" + request(_PATH, _BODY),
    "http-2": request(_PATH, _BODY, version="2.0"),
    "nul": request(_PATH, _BODY, extra="x-a: b\x00c\r\n"),
    "latin-1": request(_PATH, _BODY, extra="x-a: \xe9\r\n").replace(b"\xc3\xa9", b"\xe9"),
    # the value a sized head leaves out, where the parser and the fast path could differ
    "length-zero-led": request(_PATH, _BODY).replace(b"length: 12", b"length: 012"),
    "length-short": request(_PATH, _BODY, length=5),
    "length-over-limit": request(_PATH, _BODY + b" " * (5000 - len(_BODY))),  # all sent
    "length-ten-digits": request(_PATH, b"", length=10**9),
    "length-empty": request(_PATH, _BODY).replace(b"length: 12", b"length: "),
    "length-capital": request(_PATH, _BODY).replace(b"content-length", b"Content-Length"),
}


@pytest.mark.parametrize("name", list(_ODD))
def test_a_head_that_differs_from_a_known_one(
    pair: tuple[ThreadedServer, ...], monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Answered as by the framework, and as by the fast path when it remembers no head
    (every read through the parser, as before heads were remembered)."""
    known = request(_PATH, _BODY)

    def script(connect: Any) -> list[Any]:
        conn = connect()
        out: list[Any] = _learn(conn, known, known)
        conn.send(_ODD[name])
        out.append(conn.answer(2))
        out.append(conn.closed(0.3))
        if not out[-1]:
            conn.send(known)
            out.append(conn.answer(2))
        return out

    fast, slow = pair
    cls = fast.server.config.http_protocol_class
    with monkeypatch.context() as m:
        m.setattr(cls, "_serve_known", lambda self, data: data)
        before = both((fast, fast), script)
    now = both((fast, slow), script)
    assert now == before


def test_enqueues_of_any_length_are_served_from_one_remembered_head(
    pair: tuple[ThreadedServer, ...], served: Served
) -> None:
    """A head is remembered without its ``Content-Length`` value: enqueues whose bodies
    differ in length are served without the parser after the first, in either of the
    spellings clients use, and answer what the framework answers."""
    q = "/v1/queues/sized-items"
    values = ["v" * n for n in range(1, 41)]
    lower = [request(q + "/items", _j({"items": [{"value": v}]})) for v in values]
    capital = [r.replace(b"content-length", b"Content-Length") for r in lower]
    later = sum(map(len, lower[1:20])) + sum(map(len, capital[21:]))

    def script(connect: Any) -> list[bytes]:
        conn = connect()
        out = _learn(conn, *lower[:20], *capital[20:])
        for _ in range(8):
            out += _learn(conn, request(q + "/dequeue", _j({"count": 5})))
        return out

    out = both(pair, script)
    assert {_status(a) for a in out} == {200}
    got = [v.decode() for a in out[-8:] for v in re.findall(rb'"value":"([^"]*)"', a)]
    assert got == values
    assert served.at_least(later)


# ------------------------------------------------------------------ limits


def test_limits_hold_for_a_known_head(pair: tuple[ThreadedServer, ...], served: Served) -> None:
    path = "/v1/queues/limits-none/dequeue"
    known = request(path, _BODY)

    def script(connect: Any) -> list[Any]:
        out: list[Any] = []
        conn = connect()
        out += _learn(conn, known, known)
        conn.send(request(path, b"{}", length=5000))  # over the body limit: 413 unread
        out += [conn.answer(), conn.closed(0.3)]
        conn = connect()
        out += _learn(conn, request(path, _BODY, token=None), request(path, _BODY, token="x"))
        out += _learn(conn, known)
        conn = connect()
        conn.send(known[:-3])  # the body never ends: 408, closed
        out += [conn.answer(), conn.closed(3)]
        conn = connect()
        conn.send(known[:20])  # nor the head
        out += [conn.answer(), conn.closed(3)]
        return out

    out = both(pair, script)
    statuses = [_status(a) for a in out if isinstance(a, bytes)]
    assert statuses == [200, 200, 413, 401, 401, 200, 408, 408]
    assert served.at_least(len(known))


def test_a_connection_idle_after_a_known_head_is_closed(
    pair: tuple[ThreadedServer, ...], served: Served
) -> None:
    """The keep-alive timeout (uvicorn's 5 s, checked each second) starts again after
    an answer to a request read without the parser."""
    known = request("/v1/queues/idle-none/dequeue", _BODY)
    conn = Conn(pair[0].port)
    try:
        _learn(conn, known, known)
        assert served.at_least(len(known))
        t0 = time.monotonic()
        assert conn.closed(15)
        waited = time.monotonic() - t0
    finally:
        conn.close()
    assert 4 < waited < 8


def test_an_unexpected_error_answers_500_on_either_path(
    pair: tuple[ThreadedServer, ...], served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in the engine answers 500 ``internal_error`` and closes the connection (what
    uvicorn does after the framework's error handler answered), whether the request came
    through the parser or from a remembered head, alone or pipelined."""
    path = "/v1/queues/errors-boom/dequeue"
    known = request(path, _BODY)
    for server in pair:
        engine = server.engine
        real = engine.dequeue

        def broken(queue: str, *args: Any, real: Any = real, **kwargs: Any) -> Any:
            if queue == "errors-boom":
                raise RuntimeError("a planted bug")
            return real(queue, *args, **kwargs)

        monkeypatch.setattr(engine, "dequeue", broken)

    def script(connect: Any) -> list[Any]:
        out: list[Any] = []
        for pieces in ([known], [known], [known + known]):  # parser, remembered, pipelined
            conn = connect()
            conn.send(*pieces)
            out += [conn.answer(), conn.closed(1)]
        conn = connect()  # the server still serves
        out += _learn(conn, request("/v1/queues/errors-fine/dequeue", _BODY))
        return out

    out = both(pair, script)
    statuses = [_status(a) for a in out if isinstance(a, bytes)]
    assert statuses == [500, 500, 500, 200]
    assert out[1] is True and out[3] is True and out[5] is True  # closed after each
    assert b'"internal_error"' in out[0]
    assert served.at_least(2 * len(known))


def test_a_request_asking_to_upgrade_is_served_with_its_body(
    pair: tuple[ThreadedServer, ...],
) -> None:
    """``curl --http2`` on plain HTTP asks to upgrade to ``h2c``; no route upgrades, and
    the request is served whole as any other: its body is read (whether it comes with
    the head or after it), and a request pipelined behind it is answered too."""
    q = "/v1/queues/upgrading"
    h2c = "connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\nhttp2-settings: AAMAAABk\r\n"
    enqueue = request(q + "/items", _j({"items": [{"value": "whole"}]}), extra=h2c)
    at = enqueue.index(b"\r\n\r\n") + 4

    def script(connect: Any) -> list[Any]:
        conn = connect()
        conn.send(enqueue)
        out: list[Any] = [conn.answer(2)]
        conn.send(enqueue[:at], enqueue[at:], pause=0.2)  # the body after the head
        out.append(conn.answer(2))
        conn.send(enqueue + request(q + "/dequeue", _j({"count": 5})))
        out += [conn.answer(2), conn.answer(2)]
        conn = connect()  # a request that ends its connection, too
        conn.send(enqueue.replace(b"HTTP/1.1", b"HTTP/1.0"))
        out.append(conn.answer(2))
        return out

    out = both(pair, script)
    assert [a.split(b" ", 2)[1] for a in out] == [b"200"] * 5
    assert out[3].count(b'"value":"whole"') == 3  # (the answers' times are masked)


def test_a_request_the_parser_refuses_is_answered_in_json(
    pair: tuple[ThreadedServer, ...],
) -> None:
    """Bytes that are not HTTP (two lengths, a raw non-ASCII path) get the API's JSON
    error, saying what the parser refused, and the connection is closed."""
    bad = [
        _ODD["duplicate-length"],
        request("/v1/queues/\u00e9/items", _BODY).replace(b"\xc3\xa9", b"\xe9"),
        b"CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n",
    ]

    def script(connect: Any) -> list[Any]:
        out: list[Any] = []
        for data in bad:
            conn = connect()
            conn.send(data)
            out += [conn.answer(2), conn.closed()]
        return out

    out = both(pair, script)
    for answer in out[::2]:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head
        assert json.loads(body)["error"] == "bad_request"
    assert out[1::2] == [True, True, True]
    assert b"Duplicate Content-Length" in out[0]
    assert out[4].endswith(b'"message":"invalid HTTP request"}')  # no "User callback error"
