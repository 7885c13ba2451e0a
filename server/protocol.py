"""The HTTP/1.1 protocol ``dq serve`` runs: uvicorn's httptools protocol plus the fast path.

uvicorn's protocol starts an ASGI task per request, writes the status line and headers
and then the body as two socket writes, and our app wraps every request in Starlette's
middleware; for a single enqueue that is most of the server's CPU. This subclass
serves the hot routes (``server/hot_routes.py``) straight from the parser callbacks:
once a hot request's body is complete it is answered from the loop — at once, or when
its group commit is on disk — with one socket write and no task. Every other request,
and every hot one the fast path declines, goes to the FastAPI app exactly as uvicorn
would send it.

It also holds the connection-level limits (``docs/http.md``, "Limits"): a cap on open
connections (over it, a 503 and close), a time limit to send a request's headers and
one to send its body (a 408 and close), and the keep-alive limit: a connection idle
longer than uvicorn's keep-alive timeout (or one that never sends a request) is closed.
All three deadlines are plain numbers that one timer per event loop checks each second
(``_Sweeper``); uvicorn arms and cancels a timer per response instead.
The body limit (413 from ``Content-Length`` before reading) and the token check (401
before reading) are answered by the app's outermost middleware for every route; a
request is only a fast-path candidate if it would pass both.

The parser's callbacks cost a dozen Python calls a request, and a client sends the
same head (request line and header lines, ``Content-Length`` included) again and again.
So once the parser has read a hot request that arrived whole in one read, its head's
bytes are remembered with what the callbacks made of them (``_Head``); a later read
that starts, between requests, with the same bytes and holds the whole body is served
as the callbacks would have served it, without the parser. The parser makes the same
of the same bytes from the same state, so nothing is guessed: anything not seen
before, cut short or pipelined behind an answer to come goes to the parser as it came,
and the parser, which never sees those requests, stays between requests. Enqueues
differ in their body's length, so a head is also remembered with its one
``Content-Length`` value left out (``_Sized``): a head equal to it in every other byte,
whose value is plain digits within the body limit, is served the same way with its own
length — the one header value the parser would read differently.

Invariant: a request answered here gets the bytes the FastAPI route would answer
(``tests/server/test_hot_path.py``); the fast path never answers a request that
uvicorn has queued behind another (pipelining) before that one is answered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import httptools
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from dq.server.auth import token_ok
from dq.server.errors import error_json
from dq.server.hot_routes import HOT_ROUTES, PULL_ROUTE, HotRoutes

if TYPE_CHECKING:
    from fastapi import FastAPI

    from dq.server.settings import Settings

__all__ = ["protocol_for"]

_QUEUES = "/v1/queues/"
#: a replica group follower's pull (``server/replication/routes.py``): served here too
_PULL = "/v1/replica/pull"
_PULL_B = _PULL.encode()
_QUEUES_B = _QUEUES.encode()
_SWEEP_S = 1.0
_JSON_TYPE = b"application/json"
#: What a read must start with to be looked up among the heads seen before.
_HOT_START = b"POST /v1/"
#: Heads longer than this are not remembered; past this many, the memory starts afresh.
_HEAD_MAX = 2048
_HEADS_MAX = 256
#: The ``Content-Length`` lines a remembered head may leave its value out of, as clients
#: write them (h11 and most clients lower-case, ``http.client`` capitalised).
_LENGTH_LINES = (b"\r\ncontent-length: ", b"\r\nContent-Length: ")
#: Where the value was, in a sized head's key (a head holding a NUL is not remembered
#: sized, so a key has exactly one).
_LENGTH_GAP = b"\x00"
#: Longest ``Content-Length`` value served from a sized head (the body limit is smaller).
_LENGTH_DIGITS = 9


def protocol_for(app: FastAPI, settings: Settings) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's ``Config(http=...)``, bound to ``app``."""
    return type(
        "DqHttpProtocol",
        (DqHttpProtocol,),
        {
            "dq_app": app,
            "dq_fast": settings.fast_path,
            "dq_tokens": tuple(t.encode() for t in settings.tokens),
            # with read-only tokens set, a request without an admin token is the app's
            "dq_guarded": bool(settings.tokens or settings.read_tokens),
            "dq_body_limit": settings.body_limit,
            "dq_max_connections": settings.max_connections,
            "dq_header_timeout": settings.header_timeout_s,
            "dq_body_timeout": settings.body_timeout_s,
            # what the parser made of the heads of hot requests (per app and settings)
            "dq_heads": {},
            "dq_sized_heads": {},
        },
    )


class DqHttpProtocol(HttpToolsProtocol):
    dq_app: FastAPI
    dq_fast: bool
    dq_tokens: tuple[bytes, ...]
    dq_guarded: bool
    dq_body_limit: int
    dq_max_connections: int
    dq_header_timeout: float
    dq_body_timeout: float
    dq_heads: dict[bytes, _Head]
    dq_sized_heads: dict[bytes, _Sized]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hot_cycle: RequestResponseCycle | None = None
        self._hot: tuple[str, str] = ("", "")
        #: When the headers or body being read must be complete (0: not reading one).
        self._read_deadline = 0.0
        self._reading = "headers"
        #: When this connection, idle between requests, is closed (0: not idle).
        self._idle_deadline = 0.0
        #: The parser is inside a request (between its first byte and its end).
        self._in_message = False
        #: Requests the parser began in the current read, and the hot one it took.
        self._begun = 0
        self._seen: _Head | None = None
        #: Reads may be served from remembered heads: off for good once the parser has
        #: seen anything that ends or changes the connection.
        self._known_heads = self.dq_fast
        #: The head of a request that asked to upgrade, to be read again without asking.
        self._plain_head: bytes | None = None

    # ------------------------------------------------------------ connection limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        _Sweeper.ensure(self.loop, self.connections)
        if len(self.connections) > self.dq_max_connections:
            self._refuse(503, "too_many_connections", "the server is at its connection limit")
            return
        # A connection that never sends a request is closed like an idle keep-alive one.
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive

    # ------------------------------------------------------------ reading

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a read that starts with a head seen before is served without
        the parser (``_serve_known``), and the head of a hot request the parser read
        whole is remembered."""
        self._idle_deadline = 0.0  # data arrived
        learn = False
        if self._known_heads and not self._in_message and data.startswith(_HOT_START):
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
            # uvicorn answers text; every error of the API is JSON (docs/http.md)
            self.logger.warning("Invalid HTTP request received.")
            # (a callback's error is the head's, e.g. CONNECT's authority as its URL)
            what = "" if isinstance(exc, httptools.HttpParserCallbackError) else f": {exc}"
            self._refuse(400, "bad_request", f"invalid HTTP request{what}")
            return
        except httptools.HttpParserUpgrade as exc:
            self._known_heads = False
            if self._should_upgrade():
                self.handle_websocket_upgrade()
                return
            self._unsupported_upgrade_warning()
            head, self._plain_head = self._plain_head, None
            if head is not None:  # read it again as the ordinary request it is
                # by a new parser: after an upgrade that ends the connection (HTTP/1.0,
                # ``close``) this one would read no more
                self.parser = httptools.HttpRequestParser(self)
                self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
                self.data_received(head + data[exc.args[0] :])
            return
        if learn and self._begun == 1 and self._seen is not None and not self._in_message:
            self._learn(data, self._seen)

    def _learn(self, data: bytes, seen: _Head) -> None:
        """Remember the head of the one hot request ``data`` held, whole, from its first
        byte: the parser would make ``seen`` of those bytes again."""
        end = data.find(b"\r\n\r\n") + 4
        if 4 <= end <= _HEAD_MAX and end + seen.length == len(data):
            heads = self.dq_heads
            if len(heads) >= _HEADS_MAX:
                heads.clear()
            head = data[:end]
            heads[head] = seen
            sized = _sized_template(head, seen)
            if sized is not None:
                templates = self.dq_sized_heads
                if len(templates) >= _HEADS_MAX:
                    templates.clear()
                templates[sized[0]] = sized[1]

    def _serve_known(self, data: bytes) -> bytes:
        """Serve the requests ``data`` starts with whose heads the parser has read
        before, while each one's answer is written before the next is read; returns
        the rest, for the parser."""
        heads = self.dq_heads
        while True:
            end = data.find(b"\r\n\r\n") + 4
            if end < 4:
                return data
            head = heads.get(data[:end])
            if head is None:
                head = self._sized_head(data, end)
                if head is None:
                    return data
            stop = end + head.length
            if len(data) < stop:
                return data  # the body is still arriving: the parser reads it
            # What on_message_begin, on_headers_complete, on_body and
            # on_message_complete would have done (the parser's own request fields,
            # url and headers, are set anew when it begins its next request).
            cycle = _HotCycle(head.path, "1.1", head.headers, True, self)
            cycle.body = body = data[end:stop]  # type: ignore[assignment]
            cycle.more_body = False
            self._read_deadline = 0.0
            self.cycle = cycle  # type: ignore[assignment]
            self._hot_cycle = cycle  # type: ignore[assignment]
            self._hot = route, queue = head.hot
            # _dispatch, inline (one call less a request)
            hot: HotRoutes | None = self.dq_app.state._state.get("hot_routes")
            if hot is None:  # starting or stopping: the app answers
                self._fall_back(cycle)  # type: ignore[arg-type]
            else:
                hot.serve(route, queue, body, cycle)
            data = data[stop:]
            if self.transport.is_closing():
                return b""  # answered and closed: nothing more is read
            if not data.startswith(_HOT_START) or not self.cycle.response_complete:
                return data  # nothing more, or pipelined behind an answer to come

    def _sized_head(self, data: bytes, end: int) -> _Head | None:
        """The remembered head ``data[:end]`` equals but for its ``Content-Length``
        value, made with this request's value; None when there is none, or the value is
        not one the parser and the fast path read alike (plain digits, no leading zero)
        within the body limit."""
        for line in _LENGTH_LINES:
            start = data.find(line, 0, end)
            if start >= 0:
                break
        else:
            return None
        start += len(line)
        stop = data.find(b"\r\n", start, end)
        digits = data[start:stop]
        if (
            not 0 < len(digits) <= _LENGTH_DIGITS
            or not digits.isdigit()
            or (digits[0] == 48 and len(digits) > 1)  # a leading "0"
        ):
            return None
        sized = self.dq_sized_heads.get(data[:start] + _LENGTH_GAP + data[stop:end])
        if sized is None:
            return None
        length = int(digits)
        if length > self.dq_body_limit:
            return None  # the parser reads it, and the app refuses it (413)
        head = sized.head
        at = sized.at
        headers = (*head.headers[:at], (b"content-length", digits), *head.headers[at + 1 :])
        return _Head(head.path, headers, head.hot, length)

    def on_message_begin(self) -> None:
        # uvicorn builds the request's scope here; it is built in on_headers_complete
        # instead, and only for a request the framework serves.
        self._in_message = True
        self._begun += 1
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self._read_deadline = self.loop.time() + self.dq_header_timeout
        self._reading = "headers"

    def overdue(self, now: float) -> None:
        """Called about once a second: close a connection idle for too long, refuse a
        request that is too slow to arrive."""
        if self._idle_deadline and now > self._idle_deadline:
            self._idle_deadline = 0.0
            self.timeout_keep_alive_handler()
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

    def _unset_keepalive_if_required(self) -> None:
        self._idle_deadline = 0.0  # data arrived, or the connection is gone

    def on_response_complete(self) -> None:
        """uvicorn's, with the keep-alive limit as a deadline for the sweeper."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            self._idle_deadline = 0.0
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle_deadline = self.loop.time() + self.timeout_keep_alive

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer a connection-level refusal and close (nothing more is read); a request
        the app is reading then sees its client gone."""
        self._known_heads = False
        if self.transport.is_closing():
            return
        body = error_json(code, message)
        self.transport.write(_message(self.server_state.default_headers, status, body, b"", False))
        self.transport.close()

    # ------------------------------------------------------------ request dispatch

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
        previous = self.cycle
        if (
            self.dq_fast
            and (previous is None or previous.response_complete)  # not pipelined
            and (url.startswith(_QUEUES_B) or url == _PULL_B)
            and b"%" not in url
            and b"?" not in url
            and parser.get_method() == b"POST"
            and not self.expect_100_continue
        ):
            path = url.decode("ascii")
            hot = self._candidate(path, self.headers)
            if hot is not None:
                cycle = _HotCycle(path, version, self.headers, keep_alive, self)
                self.cycle = cycle  # type: ignore[assignment]
                self._hot_cycle = cycle  # type: ignore[assignment]
                self._hot = hot
                if self._known_heads and not parser.should_upgrade():
                    length = _content_length(self.headers)
                    if length >= 0:
                        self._seen = _Head(path, tuple(self.headers), hot, length)
                return
        self._new_scope()
        super().on_headers_complete()  # builds the cycle; may call _start_asgi_task

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

    def _new_scope(self) -> None:
        """The scope uvicorn's ``on_message_begin`` would have built."""
        self.scope = {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_message_complete(self) -> None:
        if self._plain_head is not None:
            return  # a head asking to upgrade: read again (data_received)
        self._in_message = False
        self._read_deadline = 0.0
        cycle = self._hot_cycle
        if cycle is not None and cycle is self.cycle:
            if not cycle.response_complete and not self.transport.is_closing():
                cycle.more_body = False
                self._dispatch(cycle)
            return
        super().on_message_complete()

    def on_body(self, body: bytes) -> None:
        cycle = self._hot_cycle
        if cycle is not None and cycle is self.cycle:
            cycle.body += body  # within the body limit: no flow control needed
            return
        super().on_body(body)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        hot = None
        scope = cycle.scope
        if (
            app is self.app
            and self.dq_fast
            and scope["method"] == "POST"
            and not cycle.waiting_for_100_continue
        ):
            hot = self._candidate(scope["path"], scope["headers"])
        if hot is None:
            super()._start_asgi_task(cycle, app)
            return
        self._hot_cycle = cycle
        self._hot = hot
        if not cycle.more_body:  # queued behind another request, and complete already
            self._dispatch(cycle)

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

    def _dispatch(self, cycle: RequestResponseCycle) -> None:
        # Starlette's State keeps its attributes in ``_state``; reading the dict skips a
        # Python-level ``__getattr__`` per request.
        hot: HotRoutes | None = self.dq_app.state._state.get("hot_routes")
        if hot is None:  # starting or stopping: the app answers
            self._fall_back(cycle)
            return
        route, queue = self._hot
        responder = cycle if isinstance(cycle, _HotCycle) else _Responder(self, cycle)
        hot.serve(route, queue, bytes(cycle.body), responder)

    def _broke(self, cycle: RequestResponseCycle, body: bytes) -> None:
        """What uvicorn does when the app raises after its error handler answered: the
        500, then the connection closed."""
        self._known_heads = False
        if not cycle.response_complete:
            self._reply(cycle, 500, body, b"")
        self.transport.close()

    def _fall_back(self, cycle: RequestResponseCycle) -> None:
        if self._hot_cycle is cycle:
            self._hot_cycle = None
        if isinstance(cycle, _HotCycle):
            cycle = self._framework_cycle(cycle)
        else:
            # uvicorn's own cycle (a request whose URL has a query or a %-escape, or one
            # queued behind another): its body came through ``on_body`` here, which
            # wakes no reader; unset, the app would wait for a body that has arrived.
            cycle.message_event.set()
        # The body is complete in the cycle: the app reads it as uvicorn would hand it.
        super()._start_asgi_task(cycle, self.app)

    def _framework_cycle(self, hot: _HotCycle) -> RequestResponseCycle:
        """The cycle uvicorn would have made for a request the fast path declined."""
        self._new_scope()
        scope = self.scope
        scope["headers"] = list(hot.headers)  # a remembered head's are shared
        scope["method"] = "POST"
        if hot.http_version != "1.1":
            scope["http_version"] = hot.http_version
        scope["path"] = self.root_path + hot.path
        scope["raw_path"] = self.root_path.encode("ascii") + hot.path.encode("ascii")
        scope["query_string"] = b""
        cycle = RequestResponseCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=hot.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.body = hot.body
        cycle.more_body = hot.more_body
        cycle.disconnected = hot.disconnected
        cycle.message_event.set()  # what arrived is ready to read
        if self.cycle is hot:  # type: ignore[comparison-overlap]
            self.cycle = cycle
        return cycle

    def _reply(
        self,
        cycle: RequestResponseCycle,
        status: int,
        body: bytes,
        headers: bytes,
        content_type: bytes = b"",
    ) -> None:
        if self._hot_cycle is cycle:
            self._hot_cycle = None
        if cycle.response_complete:
            return
        cycle.response_started = cycle.response_complete = True
        if cycle.disconnected:
            return
        defaults = self.server_state.default_headers
        if content_type:
            message = _binary_message(
                defaults, status, body, headers, content_type, cycle.keep_alive
            )
        else:
            message = _message(defaults, status, body, headers, cycle.keep_alive)
        self.transport.write(message)
        if self.access_log:
            self.access_logger.info(
                '%s - "POST %s HTTP/%s" %d',
                f"{self.client[0]}:{self.client[1]}" if self.client else "-",
                cycle.scope["path"],
                cycle.scope["http_version"],
                status,
            )
        if not cycle.keep_alive:
            self.transport.close()
            self.server_state.total_requests += 1
            return
        # on_response_complete, inline for the common case (nothing queued behind)
        if self.pipeline or self.flow.read_paused:
            self.on_response_complete()
            return
        self.server_state.total_requests += 1
        self._idle_deadline = self.loop.time() + self.timeout_keep_alive


class _Head(NamedTuple):
    """What the parser and ``_candidate`` made of a hot request's head."""

    path: str
    headers: tuple[tuple[bytes, bytes], ...]
    #: (route, queue)
    hot: tuple[str, str]
    #: the body's length (``Content-Length``)
    length: int


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """The request's one ``Content-Length``, or -1 (none, or not plain digits)."""
    length = -1
    for name, value in headers:
        if name == b"content-length":
            if length >= 0 or not value.isdigit():
                return -1
            length = int(value)
    return length


class _Sized(NamedTuple):
    """A remembered head without its ``Content-Length`` value: what the parser made of
    it, and where that value sits among its headers."""

    head: _Head
    #: index of the ``content-length`` header in ``head.headers``
    at: int


def _sized_template(head: bytes, seen: _Head) -> tuple[bytes, _Sized] | None:
    """The key and entry remembering ``head`` with its value left out, or None when
    the head does not hold its one ``Content-Length`` as a line of ``_LENGTH_LINES``
    with the value the parser read (``seen.length``, written plainly)."""
    if head.lower().count(b"\r\ncontent-length:") != 1 or _LENGTH_GAP in head:
        return None  # (no NUL but the gap's: keys differ wherever their heads do)
    digits = str(seen.length).encode()
    for line in _LENGTH_LINES:
        start = head.find(line)
        if start >= 0:
            break
    else:
        return None
    start += len(line)
    stop = start + len(digits)
    if head[start:stop] != digits or head[stop : stop + 2] != b"\r\n":
        return None
    names = [name for name, _ in seen.headers]
    if names.count(b"content-length") != 1:
        return None
    key = head[:start] + _LENGTH_GAP + head[stop:]
    return key, _Sized(seen, names.index(b"content-length"))


class _HotCycle:
    """What uvicorn's protocol keeps of a request the fast path is serving (in place of
    its ``RequestResponseCycle``: no scope, no event, no task), and the ``Responder``
    the hot routes answer through."""

    __slots__ = (
        "_event",
        "body",
        "disconnected",
        "headers",
        "http_version",
        "keep_alive",
        "more_body",
        "path",
        "protocol",
        "response_complete",
        "response_started",
    )

    def __init__(
        self,
        path: str,
        http_version: str,
        headers: Sequence[tuple[bytes, bytes]],
        keep_alive: bool,
        protocol: DqHttpProtocol,
    ) -> None:
        self.path = path
        self.http_version = http_version
        self.headers = headers
        self.keep_alive = keep_alive
        self.protocol = protocol
        self.body = bytearray()
        self.more_body = True
        self.response_started = self.response_complete = self.disconnected = False
        self._event: asyncio.Event | None = None

    @property
    def message_event(self) -> asyncio.Event:
        """Set when the connection is lost (``_gone`` of a long-poll waits on it)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    @property
    def scope(self) -> dict[str, Any]:
        return {"path": self.path, "http_version": self.http_version}

    def reply(self, status: int, body: bytes, headers: bytes, content_type: bytes = b"") -> None:
        self.protocol._reply(self, status, body, headers, content_type)  # type: ignore[arg-type]

    def fall_back(self) -> None:
        self.protocol._fall_back(self)  # type: ignore[arg-type]

    def broke(self, body: bytes) -> None:
        self.protocol._broke(self, body)  # type: ignore[arg-type]

    def gone(self) -> Awaitable[None]:
        return _gone(self)  # type: ignore[arg-type]


class _Responder:
    """The ``Responder`` for a hot request uvicorn had queued behind another (it has
    a ``RequestResponseCycle`` of uvicorn's)."""

    __slots__ = ("cycle", "protocol")

    def __init__(self, protocol: DqHttpProtocol, cycle: RequestResponseCycle) -> None:
        self.protocol = protocol
        self.cycle = cycle

    def reply(self, status: int, body: bytes, headers: bytes, content_type: bytes = b"") -> None:
        self.protocol._reply(self.cycle, status, body, headers, content_type)

    def fall_back(self) -> None:
        self.protocol._fall_back(self.cycle)

    def broke(self, body: bytes) -> None:
        self.protocol._broke(self.cycle, body)

    def gone(self) -> Awaitable[None]:
        return _gone(self.cycle)


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


async def _gone(cycle: RequestResponseCycle) -> None:
    """Completes when the client of ``cycle`` has disconnected."""
    while not cycle.disconnected:
        await cycle.message_event.wait()
        cycle.message_event.clear()


#: Per (status, an error's own header lines, keep_alive): the bytes before and after the
#: content length; rebuilt when uvicorn replaces its default headers (the ``date``
#: changes each second).
_heads: dict[tuple[int, bytes, bool], tuple[bytes, bytes]] = {}
_heads_for: list[tuple[bytes, bytes]] | None = None


def _message(
    defaults: list[tuple[bytes, bytes]], status: int, body: bytes, headers: bytes, keep_alive: bool
) -> bytes:
    """Status line, headers (in the order uvicorn writes a Starlette ``Response``) and
    ``body``, as one write."""
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
    return b"%s%d%s%s" % (parts[0], len(body), parts[1], body)


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
