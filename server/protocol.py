"""The HTTP/1.1 protocol ``dq serve`` runs: our own, on httptools, with the fast path.

Each connection parses requests with httptools' parser. The hot routes
(``server/hot_routes.py``: a JSON enqueue, dequeue or release, and a follower's pull)
are answered straight from the parser's callbacks: once a hot request's body is
complete it is answered from the loop — at once, or when its group commit is on disk —
with one socket write and no task. Every other request, and every hot one the fast
path declines, goes to the FastAPI app through the ASGI interface alone
(``server/http_exchange.py``: a scope, ``receive`` and ``send``), in a task.

It runs under uvicorn's ``Server`` (sockets, TLS, the lifespan, signals, the graceful
drain), which builds one protocol object per connection from ``Config(http=...)``. What
it uses of uvicorn beyond the public ``Config`` and ``Server`` is that construction —
the keywords ``config``, ``server_state``, ``app_state`` and ``_loop`` —, the
``ServerState`` it is given (``connections``, ``tasks``, ``default_headers``,
``total_requests``) and the ``shutdown()`` hook ``Server.shutdown`` calls on each
connection. ``pyproject.toml`` pins uvicorn's minor version for that, and
``tests/server/test_uvicorn_surface.py`` names each of them.

It also holds the connection-level limits (``docs/http.md``, "Limits"): a cap on open
connections (over it, a 503 and close), a time limit to send a request's headers and
one to send its body (a 408 and close), and the keep-alive limit: a connection idle
longer than ``--timeout-keep-alive`` (or one that never sends a request) is closed. All
three deadlines are plain numbers that one timer per event loop checks each second
(``_Sweeper``). The body limit (413 from ``Content-Length`` before reading) and the
token check (401 before reading) are answered by the app's outermost middleware for
every route; a request is only a fast-path candidate if it would pass both.

A hot request whose head is byte for byte one the parser has read before (or differs
from one only in its ``Content-Length`` value) is served without the parser's
callbacks (``server/known_heads.py``): only from a read that starts between requests
and holds the whole request; anything else goes to the parser as it came.

Invariants: a request answered here gets the bytes the FastAPI route would answer
(``tests/server/test_hot_path.py``); requests on one connection are answered in order
(pipelining: a request parsed while an earlier one is unanswered waits, reading paused).
"""

from __future__ import annotations

import asyncio
import logging
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, cast

import httptools

from dq.server._hotwire import message as _http_message
from dq.server.auth import token_ok
from dq.server.errors import error_json
from dq.server.hot_routes import HOT_ROUTES, PULL_ROUTE, FastPathSlot
from dq.server.http_exchange import HIGH_WATER, STATUS_LINE, Exchange
from dq.server.known_heads import HOT_START, Head, KnownHeads, content_length

if TYPE_CHECKING:
    from fastapi import FastAPI

    from dq.server.settings import Settings

__all__ = ["DqHttpProtocol", "protocol_for"]

_QUEUES = "/v1/queues/"
#: a replica group follower's pull (``server/replication/routes.py``): served here too
_PULL = "/v1/replica/pull"
_PULL_B = _PULL.encode()
_QUEUES_B = _QUEUES.encode()
_SWEEP_S = 1.0
_JSON_TYPE = b"application/json"


def protocol_for(app: FastAPI, settings: Settings) -> type[DqHttpProtocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, bound to ``app``."""
    slot: FastPathSlot = app.state.fast_path
    return type(
        "DqHttpProtocol",
        (DqHttpProtocol,),
        {
            "dq_app": app,
            "dq_slot": slot,
            "dq_fast": settings.fast_path,
            "dq_tokens": tuple(t.encode() for t in settings.tokens),
            # with read-only tokens set, a request without an admin token is the app's
            "dq_guarded": bool(settings.tokens or settings.read_tokens),
            "dq_body_limit": settings.body_limit,
            "dq_max_connections": settings.max_connections,
            "dq_header_timeout": settings.header_timeout_s,
            "dq_body_timeout": settings.body_timeout_s,
            # what the parser made of the heads of hot requests (per app and settings)
            "dq_heads": KnownHeads(settings.body_limit),
        },
    )


class DqHttpProtocol(asyncio.Protocol):
    dq_app: FastAPI
    dq_slot: FastPathSlot
    dq_fast: bool
    dq_tokens: tuple[bytes, ...]
    dq_guarded: bool
    dq_body_limit: int
    dq_max_connections: int
    dq_header_timeout: float
    dq_body_timeout: float
    dq_heads: KnownHeads

    def __init__(
        self,
        config: Any,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # what uvicorn's ``Server`` hands each connection (see the module docstring)
        self.loop = _loop or asyncio.get_running_loop()
        self.server_state = server_state
        self.connections: set[Any] = server_state.connections
        self.tasks: set[asyncio.Task[None]] = server_state.tasks
        self.app_state = app_state
        self.root_path: str = config.root_path
        self.timeout_keep_alive: float = config.timeout_keep_alive
        self.logger = logging.getLogger("uvicorn.error")
        self.access_logger = logging.getLogger("uvicorn.access")
        self.access_log = self.access_logger.hasHandlers()
        self.parser = _parser(self)
        # the connection
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.server: tuple[str, int] | None = None
        self.client: tuple[str, int] | None = None
        self.scheme = "http"
        self.reads_paused = False
        self.writes_paused = False
        self._writable: asyncio.Event | None = None
        #: requests parsed while an earlier one is unanswered, oldest first
        self.pipeline: deque[_HotRequest | Exchange] = deque()
        #: the request the parser read last (answered, being answered, or waiting)
        self.cycle: _HotRequest | Exchange | None = None
        # the request being parsed
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.expect_100_continue = False
        #: When the headers or body being read must be complete (0: not reading one).
        self._read_deadline = 0.0
        self._reading = "headers"
        #: When this connection, idle between requests, is closed (0: not idle).
        self._idle_deadline = 0.0
        #: The parser is inside a request (between its first byte and its end).
        self._in_message = False
        #: Requests the parser began in the current read, and the hot one it took.
        self._begun = 0
        self._seen: Head | None = None
        #: Reads may be served from remembered heads: off for good once the parser has
        #: seen anything that ends or changes the connection.
        self._known_heads = self.dq_fast
        #: The head of a request that asked to upgrade, to be read again without asking.
        self._plain_head: bytes | None = None

    # ------------------------------------------------------------ the connection

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.connections.add(self)
        self._count_connections()
        # a stream transport (asyncio's or uvloop's, which is no subclass of it)
        self.transport = cast("asyncio.Transport", transport)
        self.server = _address(transport.get_extra_info("sockname"))
        self.client = _address(transport.get_extra_info("peername"))
        self.scheme = "https" if transport.get_extra_info("sslcontext") else "http"
        _Sweeper.ensure(self.loop, self.connections)
        if len(self.connections) > self.dq_max_connections:
            self._refuse(503, "too_many_connections", "the server is at its connection limit")
            return
        # A connection that never sends a request is closed like an idle keep-alive one.
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive

    def connection_lost(self, exc: Exception | None) -> None:
        self.connections.discard(self)
        self._count_connections()
        cycle = self.cycle
        if cycle is not None:
            if not cycle.response_complete:
                cycle.disconnected = True
            cycle.message_event.set()  # a long-poll's ``gone``, an app's ``receive``
        if self._writable is not None:
            self._writable.set()
        self.writes_paused = False
        if exc is None:
            self.transport.close()
        self._idle_deadline = 0.0
        self.parser = None  # type: ignore[assignment]

    def _count_connections(self) -> None:
        """Tell the loop's group commits whether this server has one connection: its
        writes then stay on the loop on a slow disk too (``InlineCommits.alone``), since
        no other client's request can be waiting behind the fsync."""
        hot = self.dq_slot.hot
        inline = None if hot is None else hot.service.inline
        if inline is not None:
            inline.alone = len(self.connections) == 1

    def eof_received(self) -> None:
        pass

    def shutdown(self) -> None:
        """uvicorn's graceful stop: close when idle, else once the answer is written."""
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            self.transport.close()
        else:
            cycle.keep_alive = False

    def pause_writing(self) -> None:
        self.writes_paused = True
        if self._writable is not None:
            self._writable.clear()

    def resume_writing(self) -> None:
        self.writes_paused = False
        if self._writable is not None:
            self._writable.set()

    async def drained(self) -> None:
        """Returns once the socket's buffer has room again (or the connection is gone)."""
        if self._writable is None:
            self._writable = asyncio.Event()
        if self.writes_paused:
            await self._writable.wait()

    def pause_reading(self) -> None:
        if not self.reads_paused:
            self.reads_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reads_paused:
            self.reads_paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------ reading

    def data_received(self, data: bytes) -> None:
        """Feed the parser; a read that starts with a head seen before is served without
        it (``_serve_known``), and the head of a hot request the parser read whole is
        remembered."""
        self._idle_deadline = 0.0  # data arrived
        learn = False
        if self._known_heads and not self._in_message and data.startswith(HOT_START):
            cycle = self.cycle
            if cycle is None or cycle.response_complete:
                data = self._serve_known(data)
                if not data:
                    return
                learn = self._known_heads and not self._in_message
                self._begun = 0
                self._seen = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.logger.warning("Invalid HTTP request received.")
            # every error of the API is JSON (docs/http.md); a callback's error is the
            # head's (e.g. CONNECT's authority as its URL), not the parser's plumbing
            what = "" if isinstance(exc, httptools.HttpParserCallbackError) else f": {exc}"
            self._refuse(400, "bad_request", f"invalid HTTP request{what}")
            return
        except httptools.HttpParserUpgrade as exc:
            # No route upgrades: a request asking to is served as the request it is.
            self._known_heads = False
            self.logger.warning("Unsupported upgrade request.")
            head, self._plain_head = self._plain_head, None
            if head is not None:  # read it again as the ordinary request it is
                # by a new parser: after an upgrade that ends the connection (HTTP/1.0,
                # ``close``) this one would read no more
                self.parser = _parser(self)
                self.data_received(head + data[exc.args[0] :])
            return
        if learn and self._begun == 1 and self._seen is not None and not self._in_message:
            self.dq_heads.learn(data, self._seen)

    def _serve_known(self, data: bytes) -> bytes:
        """Serve the requests ``data`` starts with whose heads the parser has read
        before, while each one's answer is written before the next is read; returns
        the rest, for the parser."""
        heads = self.dq_heads
        exact = heads.exact
        while True:
            end = data.find(b"\r\n\r\n") + 4
            if end < 4:
                return data
            head = exact.get(data[:end])
            if head is None:
                head = heads.find(data, end)
                if head is None:
                    return data
            stop = end + head.length
            if len(data) < stop:
                return data  # the body is still arriving: the parser reads it
            # What the parser's callbacks would have done (the parser's own request
            # fields are set anew when it begins its next request).
            request = _HotRequest(head.path, "1.1", head.headers, True, self, head.hot)
            request.body = body = data[end:stop]
            request.more_body = False
            self._read_deadline = 0.0
            self.cycle = request
            hot = self.dq_slot.hot  # _dispatch, inline (one call less a request)
            if hot is None:  # starting or stopping: the app answers
                self._fall_back(request)
            else:
                hot.serve(head.hot[0], head.hot[1], body, request)
            data = data[stop:]
            if self.transport.is_closing():
                return b""  # answered and closed: nothing more is read
            if not data.startswith(HOT_START) or not request.response_complete:
                return data  # nothing more, or pipelined behind an answer to come

    # ------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._in_message = True
        self._begun += 1
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._read_deadline = self.loop.time() + self.dq_header_timeout
        self._reading = "headers"

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        if parser.should_upgrade() and parser.get_method() != b"CONNECT":
            self._plain_head = self._head_without_upgrade()
            return  # nothing is served: the parser stops here (data_received)
        self._read_deadline = self.loop.time() + self.dq_body_timeout
        self._reading = "body"
        version = parser.get_http_version()
        keep_alive = version != "1.0" and parser.should_keep_alive()
        if version != "1.1" or not keep_alive:
            # the connection ends after this request: later bytes stay the parser's
            self._known_heads = False
        url = self.url
        request: _HotRequest | Exchange | None = None
        if (
            self.dq_fast
            and (url.startswith(_QUEUES_B) or url == _PULL_B)
            and b"%" not in url
            and b"?" not in url
            and parser.get_method() == b"POST"
            and not self.expect_100_continue
        ):
            path = url.decode("ascii")
            hot = self._candidate(path, self.headers)
            if hot is not None:
                request = _HotRequest(path, version, self.headers, keep_alive, self, hot)
                if self._known_heads:
                    length = content_length(self.headers)
                    if length >= 0:
                        self._seen = Head(path, tuple(self.headers), hot, length)
        if request is None:
            request = Exchange(self, self._scope(version), keep_alive, self.expect_100_continue)
        previous = self.cycle
        self.cycle = request
        if previous is None or previous.response_complete:
            self._start(request)
        else:  # pipelined: answered after the requests before it
            self.pause_reading()
            self.pipeline.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.cycle
        if request is None or request.response_complete:
            return  # answered already (e.g. refused before its body came): dropped
        request.body += body
        if isinstance(request, Exchange):
            if len(request.body) > HIGH_WATER:
                self.pause_reading()
            request.message_event.set()

    def on_message_complete(self) -> None:
        if self._plain_head is not None:
            return  # a head asking to upgrade: read again (data_received)
        self._in_message = False
        self._read_deadline = 0.0
        request = self.cycle
        if request is None or request.response_complete:
            return
        request.more_body = False
        if isinstance(request, Exchange):
            request.message_event.set()
        elif request.started and not self.transport.is_closing():
            self._dispatch(request)

    def _head_without_upgrade(self) -> bytes:
        """The head just read, without its ``Upgrade`` header. No route upgrades (not to
        WebSocket, not to ``h2c`` as ``curl --http2`` asks), but the parser reads
        nothing past the head of a request asking to (its body would be lost, and the
        request answered without it): such a head is read again without the header,
        so the request is served whole, as any other."""
        parser = self.parser
        lines = [
            b"%s %s HTTP/%s\r\n"
            % (parser.get_method(), self.url, parser.get_http_version().encode())
        ]
        lines += [b"%s: %s\r\n" % pair for pair in self.headers if pair[0] != b"upgrade"]
        lines.append(b"\r\n")
        return b"".join(lines)

    def _scope(self, version: str) -> dict[str, Any]:
        """The ASGI scope of the request whose head was just read."""
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        root = self.root_path
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": self.parser.get_method().decode("ascii"),
            "root_path": root,
            "path": root + path,
            "raw_path": root.encode("ascii") + raw_path,
            "query_string": parsed.query or b"",
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    # ------------------------------------------------------------ requests

    def _start(self, request: _HotRequest | Exchange) -> None:
        """Its turn has come: a hot request is served once its body is complete, any
        other one is handed to the app."""
        if isinstance(request, Exchange):
            self._run_app(request)
        else:
            request.started = True
            if not request.more_body:
                self._dispatch(request)

    def _run_app(self, exchange: Exchange) -> None:
        task = self.loop.create_task(exchange.run(self.dq_app))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def _candidate(
        self, path: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[str, str] | None:
        """(route, queue) if the fast path may take this POST, else ``None``."""
        if path == _PULL:
            queue, route = "", PULL_ROUTE
        elif not path.startswith(_QUEUES):
            return None
        else:
            queue, _, route = path[len(_QUEUES) :].partition("/")
            if route not in HOT_ROUTES or not queue:
                return None
        length = -1
        ctype = auth = None
        for name, value in headers:
            if name == b"content-length":
                length = int(value) if value.isdigit() else -1
            # a header given twice counts as the framework counts it: the first one
            elif name == b"content-type":
                if ctype is None:
                    ctype = value
            elif name == b"authorization":
                if auth is None:
                    auth = value
            elif name == b"transfer-encoding":
                return None
        if ctype is None or not 0 <= length <= self.dq_body_limit:
            return None
        if ctype != _JSON_TYPE and ctype.split(b";", 1)[0].strip().lower() != _JSON_TYPE:
            return None
        if self.dq_guarded and not token_ok(auth, self.dq_tokens):
            return None
        return route, queue

    def _dispatch(self, request: _HotRequest) -> None:
        hot = self.dq_slot.hot
        if hot is None:  # starting or stopping: the app answers
            self._fall_back(request)
            return
        route, queue = request.hot
        hot.serve(route, queue, bytes(request.body), request)

    def _fall_back(self, request: _HotRequest) -> None:
        """Hand a hot request the fast path declined to the app, as any other request."""
        headers = list(request.headers)  # a remembered head's are shared
        root = self.root_path
        scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": request.http_version,
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,
            "method": "POST",
            "root_path": root,
            "path": root + request.path,
            "raw_path": root.encode("ascii") + request.path.encode("ascii"),
            "query_string": b"",
            "headers": headers,
            "state": self.app_state.copy(),
        }
        exchange = Exchange(self, scope, request.keep_alive)
        exchange.body = request.body
        exchange.more_body = request.more_body
        exchange.disconnected = request.disconnected
        exchange.message_event.set()  # what arrived is ready to read
        if self.cycle is request:
            self.cycle = exchange
        self._run_app(exchange)

    def _broke(self, request: _HotRequest, body: bytes) -> None:
        """A request that met a bug: the 500, then the connection closed (as when the
        app raises after its error handler answered)."""
        self._known_heads = False
        if not request.response_complete:
            self._reply(request, 500, body, b"")
        self.transport.close()

    def _reply(
        self,
        request: _HotRequest,
        status: int,
        body: bytes,
        headers: bytes,
        content_type: bytes = b"",
    ) -> None:
        """A hot request's answer: status line, headers and body in one write."""
        if request.response_complete:
            return
        request.response_started = request.response_complete = True
        if request.disconnected:
            return
        defaults = self.server_state.default_headers
        if content_type:
            message = _binary_message(
                defaults, status, body, headers, content_type, request.keep_alive
            )
        else:
            message = _message(defaults, status, body, headers, request.keep_alive)
        self.transport.write(message)
        if self.access_log:
            self.log_access({"path": request.path, "http_version": request.http_version}, status)
        if not request.keep_alive:
            self.transport.close()
            self.server_state.total_requests += 1
            return
        # response_done, inline for the common case (nothing queued behind)
        if self.pipeline or self.reads_paused:
            self.response_done()
            return
        self.server_state.total_requests += 1
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive

    def response_done(self) -> None:
        """The current request is answered: start the next one waiting, or count the
        keep-alive limit from now."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.resume_reading()
        if self.pipeline:
            self._idle_deadline = 0.0
            self._start(self.pipeline.popleft())
        else:
            self._idle_deadline = self.loop.time() + self.timeout_keep_alive

    def log_access(self, scope: dict[str, Any], status: int) -> None:
        """One line of the access log (``--access-log``), as uvicorn writes it."""
        if self.access_log:
            method = scope.get("method", "POST")
            path = urllib.parse.quote(scope["path"])
            query = scope.get("query_string", b"")
            if query:
                path = f"{path}?{query.decode('ascii')}"
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                f"{self.client[0]}:{self.client[1]}" if self.client else "-",
                method,
                path,
                scope["http_version"],
                status,
            )

    # ------------------------------------------------------------ limits

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer a connection-level refusal and close (nothing more is read); a request
        the app is reading then sees its client gone."""
        self._known_heads = False
        if self.transport.is_closing():
            return
        body = error_json(code, message)
        self.transport.write(_message(self.server_state.default_headers, status, body, b"", False))
        self.transport.close()

    def overdue(self, now: float) -> None:
        """Called about once a second: close a connection idle for too long, refuse a
        request that is too slow to arrive."""
        if self._idle_deadline and now > self._idle_deadline:
            self._idle_deadline = 0.0
            if not self.transport.is_closing():
                self.transport.close()
            return
        if self._read_deadline and now > self._read_deadline:
            self._read_deadline = 0.0
            what = self._reading
            limit = self.dq_header_timeout if what == "headers" else self.dq_body_timeout
            cycle = self.cycle
            if what == "body" and cycle is not None and cycle.response_started:
                self.transport.close()  # the app is answering already: just end it
                return
            self._refuse(408, "request_timeout", f"the request {what} took longer than {limit:g} s")


def _parser(protocol: DqHttpProtocol) -> httptools.HttpRequestParser:
    parser = httptools.HttpRequestParser(protocol)
    # a request pipelined behind one that closes the connection is read, not refused
    parser.set_dangerous_leniencies(lenient_data_after_close=True)
    return parser


def _address(info: Any) -> tuple[str, int] | None:
    """A socket address as ASGI gives it: (host, port), or None (a Unix socket)."""
    if isinstance(info, tuple) and len(info) >= 2:
        return str(info[0]), int(info[1])
    return None


class _HotRequest:
    """A request the fast path is serving: what the parser (or a remembered head) made
    of it, its body, and the ``Responder`` the hot routes answer through."""

    __slots__ = (
        "_event",
        "body",
        "disconnected",
        "headers",
        "hot",
        "http_version",
        "keep_alive",
        "more_body",
        "path",
        "protocol",
        "response_complete",
        "response_started",
        "started",
    )

    def __init__(
        self,
        path: str,
        http_version: str,
        headers: Sequence[tuple[bytes, bytes]],
        keep_alive: bool,
        protocol: DqHttpProtocol,
        hot: tuple[str, str],
    ) -> None:
        self.path = path
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive
        self.protocol = protocol
        #: (route, queue)
        self.hot = hot
        #: the body as it arrives (a ``bytes`` slice when a remembered head served it)
        self.body: bytes | bytearray = bytearray()
        self.more_body = True
        self.started = False
        self.response_started = self.response_complete = self.disconnected = False
        self._event: asyncio.Event | None = None

    @property
    def message_event(self) -> asyncio.Event:
        """Set when the connection is lost (``gone`` of a long-poll waits on it)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def reply(self, status: int, body: bytes, headers: bytes, content_type: bytes = b"") -> None:
        self.protocol._reply(self, status, body, headers, content_type)

    def fall_back(self) -> None:
        self.protocol._fall_back(self)

    def broke(self, body: bytes) -> None:
        self.protocol._broke(self, body)

    def gone(self) -> Awaitable[None]:
        return _gone(self)


async def _gone(request: _HotRequest) -> None:
    """Completes when the client of ``request`` has disconnected."""
    while not request.disconnected:
        await request.message_event.wait()
        request.message_event.clear()


class _Sweeper:
    """One timer per event loop that checks every connection's read deadline each
    second (a timer per request would cost more than the check).

    A sweep that runs far later than it was due finds the process woken from a pause (a
    SIGSTOP, a VM frozen, a long GC stop): every keep-alive deadline has passed, and the
    requests clients sent meanwhile still sit unread in the sockets (the loop runs its
    timers before it polls them). Closing then would reset those connections, and the
    clients could not tell whether their write was done; so a late sweep closes nothing
    and the next one, a second later, checks again once they have been read."""

    _loops: set[asyncio.AbstractEventLoop] = set()

    @classmethod
    def ensure(cls, loop: asyncio.AbstractEventLoop, connections: set[Any]) -> None:
        if loop not in cls._loops:
            cls._loops.add(loop)
            loop.call_later(_SWEEP_S, cls._sweep, loop, connections, loop.time() + _SWEEP_S)

    @classmethod
    def _sweep(
        cls, loop: asyncio.AbstractEventLoop, connections: set[Any], due: float, late: bool = False
    ) -> None:
        if loop.is_closed():
            cls._loops.discard(loop)
            return
        now = loop.time()
        woken = now - due > _SWEEP_S and not late  # at most one sweep in a row skipped
        if not woken:
            for conn in list(connections):
                if isinstance(conn, DqHttpProtocol):
                    conn.overdue(now)
        loop.call_later(_SWEEP_S, cls._sweep, loop, connections, now + _SWEEP_S, woken)


#: Per (status, an error's own header lines, keep_alive): the bytes before and after the
#: content length; rebuilt when uvicorn replaces its default headers (the ``date``
#: changes each second).
_heads: dict[tuple[int, bytes, bool], tuple[bytes, bytes]] = {}
_heads_for: list[tuple[bytes, bytes]] | None = None


def _message(
    defaults: list[tuple[bytes, bytes]], status: int, body: bytes, headers: bytes, keep_alive: bool
) -> bytes:
    """Status line, headers (in the order ``Exchange`` writes a Starlette ``Response``)
    and ``body``, as one write (joined with the body's length in one allocation by
    ``server/_hotwire.c``)."""
    global _heads_for
    if defaults is not _heads_for:
        _heads.clear()
        _heads_for = defaults
    key = (status, headers, keep_alive)
    parts = _heads.get(key)
    if parts is None:
        parts = _heads[key] = (
            b"".join(
                (
                    STATUS_LINE[status],
                    *(b"%s: %s\r\n" % pair for pair in defaults),
                    headers,
                    b"content-length: ",
                )
            ),
            b"\r\ncontent-type: application/json\r\n"
            + (b"" if keep_alive else b"connection: close\r\n")
            + b"\r\n",
        )
    return _http_message(parts[0], parts[1], body)


def _binary_message(
    defaults: list[tuple[bytes, bytes]],
    status: int,
    body: bytes,
    headers: bytes,
    content_type: bytes,
    keep_alive: bool,
) -> bytes:
    """Like ``_message`` for an answer whose header lines change every time (a pull's
    lsns) and whose body is not JSON: built whole, never cached."""
    return b"".join(
        (
            STATUS_LINE[status],
            *(b"%s: %s\r\n" % pair for pair in defaults),
            headers,
            b"content-length: %d\r\ncontent-type: %s\r\n" % (len(body), content_type),
            b"" if keep_alive else b"connection: close\r\n",
            b"\r\n",
            body,
        )
    )
