"""HTTP/1.1 connections for the client: one response parser, a blocking socket
connection and an asyncio one.

Why not httpx or ``http.client``: per request httpx spent ~550 µs of CPU and
``http.client`` ~130 µs (its header parsing goes through ``email``), while the client
only ever speaks to dq — JSON requests with a ``Content-Length``, answers with a
``Content-Length`` or chunked. This module does exactly that, with one send and usually
one receive per request, for ``Client`` and ``AsyncClient`` alike.

Invariants kept:
  - a connection carries one request at a time (no pipelining);
  - ``NotSent`` means the request cannot have reached the server (the connect or the
    send failed, so the server never had the whole request); ``Lost`` means it may have
    (the request went out and no complete answer came back): the caller decides whether
    that may be retried;
  - a connection is reused only after a complete answer without ``Connection: close``,
    and only if it has not become readable while idle (the server closed it).
"""

from __future__ import annotations

import asyncio
import errno
import os
import re
import select
import socket
import ssl
import struct
import weakref
from dataclasses import dataclass

__all__ = [
    "AsyncConnection",
    "Connection",
    "Lost",
    "NotSent",
    "Response",
    "ResponseParser",
]

MAX_HEAD = 64 * 1024  # status line and headers of one answer
#: Bytes asked for per receive. Not more: ``recv(n)`` allocates ``n`` bytes first, and
#: at 256 KiB that allocation (an mmap and munmap) cost more than the receive itself.
RECV_SIZE = 64 * 1024
#: How a connection is opened; the client's tests put a failing connect here.
open_socket = socket.create_connection
_NO_BODY = frozenset({204, 304})


#: Bumped in a child after ``fork()``: a connection made before it is the parent's.
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


def _timeval(seconds: float) -> bytes:
    """``struct timeval`` for ``SO_RCVTIMEO``/``SO_SNDTIMEO`` (0 would mean never)."""
    whole = int(min(seconds, 1e9))
    micros = max(int((seconds - whole) * 1e6), 0 if whole else 1)
    return struct.pack("@ll", whole, micros)


class NotSent(Exception):
    """The request did not reach the server: it is safe to send it again."""


class Lost(Exception):
    """The request may have reached the server, but no complete answer came back."""


@dataclass(slots=True)
class Response:
    """One answer. Not frozen: a frozen dataclass is built by an ``object.__setattr__``
    call per field, on every request."""

    status: int
    body: bytes
    close: bool  # the server closes the connection after this answer


#: A plain answer's head, lowercased, matched in one call: ``http/1.1``, a final status,
#: header lines of which exactly one is ``content-length`` (written the usual way,
#: digits) and none ``transfer-encoding`` or ``connection`` (their names as the parser
#: reads them: blanks around), then the empty line. A line may not be empty or hold a
#: lone CR or LF, so the match cannot run past the head's end.
_OTHER_LINE = rb"\r\n(?!\s*(?:content-length|transfer-encoding|connection)\s*:)[^\r\n]+"
_PLAIN_HEAD = re.compile(
    rb"http/1\.1 ([2-9]\d\d)[^\r\n]*(?:%s)*\r\ncontent-length:[ \t]*(\d+)[ \t]*(?:%s)*\r\n\r\n"
    % (_OTHER_LINE, _OTHER_LINE)
)
#: how much of an answer is lowercased for ``_PLAIN_HEAD`` (a longer head: the parser)
_PLAIN_HEAD_MAX = 2048


def whole_answer(data: bytes) -> Response | None:
    """The answer in ``data`` when it is a plain one (``_PLAIN_HEAD``) and its body is
    all there; ``None`` otherwise, and then ``data`` goes to a ``ResponseParser``, which
    takes every answer. dq's server answers so, read in one receive: one regular
    expression instead of a loop over header lines. Bytes after the body are ignored,
    as the parser ignores them."""
    if data[:9] != b"HTTP/1.1 ":
        return None
    match = _PLAIN_HEAD.match(data[:_PLAIN_HEAD_MAX].lower())
    if match is None:
        return None
    code, length_text = match.groups()
    status = int(code)
    length = 0 if status in _NO_BODY else int(length_text)
    start = match.end()
    if len(data) < start + length:
        return None
    return Response(status, data[start : start + length], False)


class ResponseParser:
    """Sans-IO: ``feed`` bytes as they arrive until it returns the ``Response``."""

    __slots__ = ("_body", "_buf", "_chunked", "_close", "_length", "_status")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._status = 0
        self._length: int | None = None
        self._chunked = False
        self._close = False
        self._body: list[bytes] = []

    def feed(self, data: bytes) -> Response | None:
        self._buf += data
        while self._status == 0:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD:
                    raise Lost("answer head too long")
                return None
            self._head(bytes(self._buf[:end]))
            del self._buf[: end + 4]
        if self._chunked:
            return self._chunks()
        if self._length is None:
            return None  # the body runs until the server closes the connection
        if len(self._buf) < self._length:
            return None
        body = bytes(self._buf[: self._length])
        del self._buf[: self._length]
        return Response(self._status, body, self._close)

    def feed_eof(self) -> Response:
        """The server closed the connection: the answer is complete only if it said so."""
        if self._status != 0 and self._length is None and not self._chunked:
            return Response(self._status, bytes(self._buf), True)
        raise Lost("the server closed the connection before a complete answer")

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise Lost(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
        status = int(code)
        if 100 <= status < 200:
            return  # an interim answer (100 Continue): the real one follows
        self._status = status
        self._close = version == b"HTTP/1.0"
        length: int | None = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise Lost(f"bad Content-Length: {value[:40]!r}") from None
            elif name == b"transfer-encoding":
                self._chunked = b"chunked" in value.lower()
            elif name == b"connection":
                token = value.strip().lower()
                self._close = token == b"close" or (self._close and token != b"keep-alive")
        if status in _NO_BODY:
            length = 0
        self._length = None if self._chunked else length

    def _chunks(self) -> Response | None:
        buf = self._buf
        while True:
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                return None
            size_text = bytes(buf[:line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise Lost(f"bad chunk size: {size_text[:20]!r}") from None
            if size == 0:
                end = buf.find(b"\r\n\r\n", line_end)  # the (empty) trailer section
                if end < 0:
                    return None
                del buf[: end + 4]
                return Response(self._status, b"".join(self._body), self._close)
            start = line_end + 2
            if len(buf) < start + size + 2:
                return None
            self._body.append(bytes(buf[start : start + size]))
            del buf[: start + size + 2]


def _tls_wrap(
    sock: socket.socket, context: ssl.SSLContext | None, server_hostname: str
) -> socket.socket:
    if context is None:
        return sock
    return context.wrap_socket(sock, server_hostname=server_hostname)


class Connection:
    """One blocking keep-alive connection (used by one thread at a time)."""

    def __init__(
        self,
        host: str,
        port: int,
        timeout: float,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        try:
            sock = open_socket((host, port), timeout)
        except OSError as exc:
            raise NotSent(f"cannot connect to {host}:{port}: {exc!r}") from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock = _tls_wrap(sock, tls, host)
        except (OSError, ssl.SSLError) as exc:
            sock.close()
            raise NotSent(f"cannot set up the connection to {host}:{port}: {exc!r}") from exc
        # Plain TCP: blocking, with the timeout kept by the kernel (a Python socket
        # timeout poll()s before every send and every receive, two more syscalls a
        # request). Not under TLS: Python's ssl retries a read the kernel timed out.
        self._kernel_timeout = tls is None
        if self._kernel_timeout:
            sock.settimeout(None)
        self.sock = sock
        # one poll object per connection: half the cost of a select() per request
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        self._poll = poller.poll
        self.generation = _generation
        self.closed = False
        self._timeout = -1.0
        # a connection dropped with its thread is closed without a ResourceWarning
        self._finalizer = weakref.finalize(self, sock.close)

    def usable(self) -> bool:
        """Not closed, not inherited across fork(), and not closed by the server meanwhile
        (an idle keep-alive connection that turned readable holds an EOF or junk)."""
        if self.closed or self.generation != _generation:
            return False
        try:
            return not self._poll(0)  # any event (data, EOF, error, hang-up): not usable
        except (OSError, ValueError):
            return False

    def _set_timeout(self, timeout: float) -> None:
        if not self._kernel_timeout:
            self.sock.settimeout(timeout)
        elif timeout != self._timeout:
            value = _timeval(timeout)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
            self._timeout = timeout

    def request(self, data: bytes, timeout: float) -> Response:
        sock = self.sock
        try:
            if timeout != self._timeout or not self._kernel_timeout:
                self._set_timeout(timeout)
            sock.sendall(data)
        except OSError as exc:
            self.close()
            raise NotSent(f"sending failed: {exc!r}") from exc
        try:
            chunk = sock.recv(RECV_SIZE)
            response = whole_answer(chunk) if chunk else None
            if response is None:  # in parts, or not the usual shape: the full parser
                parser = ResponseParser()
                while True:
                    response = parser.feed_eof() if not chunk else parser.feed(chunk)
                    if response is not None:
                        break
                    chunk = sock.recv(RECV_SIZE)
        except (OSError, Lost) as exc:
            self.close()
            if isinstance(exc, Lost):
                raise
            if isinstance(exc, (BlockingIOError, TimeoutError, ssl.SSLWantReadError)) or (
                exc.errno == errno.EAGAIN
            ):
                raise Lost(f"no answer within {timeout:g} s") from exc
            raise Lost(f"no answer: {exc!r}") from exc
        if response.close:
            self.close()
        return response

    def close(self) -> None:
        self.closed = True
        self._finalizer()


class _Protocol(asyncio.BufferedProtocol):
    """Hands a complete answer to the waiting request; notices the server closing.

    Buffered: the event loop receives into this connection's one buffer, where a plain
    protocol would have it allocate 256 KiB per receive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Response] | None = None
        #: the answer's parser once it came in parts (``None``: nothing received yet)
        self.parser: ResponseParser | None = None
        #: the transport let go of the socket (``connection_lost``)
        self.lost = False
        self._view = memoryview(bytearray(RECV_SIZE))
        self.closed = False
        #: When the request in flight times out (0: none in flight), and its timeout.
        self.deadline = 0.0
        self.timeout_s = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """The request in flight fails with ``Lost`` after ``timeout`` s. One timer per
        connection, armed again only when it would fire too late: a timer made and
        cancelled per request costs more than the request's own parsing."""
        deadline = loop.time() + timeout
        self.deadline = deadline
        self.timeout_s = timeout
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = loop.call_at(deadline, self._check_deadline, loop)

    def _check_deadline(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        waiter = self.waiter
        if waiter is None or waiter.done() or not self.deadline:
            return  # idle: the next request arms it again
        if loop.time() >= self.deadline:
            waiter.set_exception(Lost(f"no answer within {self.timeout_s:g} s"))
        else:  # a later request's deadline
            self._timer = loop.call_at(self.deadline, self._check_deadline, loop)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        self.data_received(bytes(self._view[:nbytes]))

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            self._abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        parser = self.parser
        try:
            if parser is None:
                response = whole_answer(data)
                if response is None:
                    self.parser = parser = ResponseParser()
                    response = parser.feed(data)
            else:
                response = parser.feed(data)
        except Lost as exc:
            self._abort()
            waiter.set_exception(exc)
            return
        if response is not None:
            waiter.set_result(response)

    def eof_received(self) -> bool:
        self._ended()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._ended()

    def _ended(self) -> None:
        self.closed = True
        self.disarm()
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            try:
                waiter.set_result((self.parser or ResponseParser()).feed_eof())
            except Lost as exc:
                waiter.set_exception(exc)

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class AsyncConnection:
    """One asyncio keep-alive connection (one request at a time)."""

    def __init__(self, protocol: _Protocol) -> None:
        self._protocol = protocol

    @classmethod
    async def open(
        cls, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None
    ) -> AsyncConnection:
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await asyncio.wait_for(
                loop.create_connection(
                    _Protocol, host, port, ssl=tls, server_hostname=host if tls else None
                ),
                timeout,
            )
        except (TimeoutError, OSError, ssl.SSLError) as exc:
            raise NotSent(f"cannot connect to {host}:{port}: {exc!r}") from exc
        transport = protocol.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(protocol)

    def usable(self) -> bool:
        protocol = self._protocol
        return (
            not protocol.closed
            and protocol.transport is not None
            and (not protocol.transport.is_closing())
        )

    async def request(self, data: bytes, timeout: float) -> Response:
        protocol = self._protocol
        transport = protocol.transport
        if protocol.closed or transport is None or transport.is_closing():
            raise NotSent("the connection closed before the request was sent")
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Response] = loop.create_future()
        protocol.parser = None
        protocol.waiter = waiter
        transport.write(data)
        protocol.arm(loop, timeout)
        try:
            response = await waiter
        except BaseException:
            self.close()  # a cancelled or failed request leaves the stream mid-answer
            raise
        finally:
            protocol.deadline = 0.0
            protocol.waiter = None
        if response.close:
            self.close()
        return response

    def close(self) -> None:
        protocol = self._protocol
        protocol.closed = True
        protocol.disarm()
        if protocol.transport is not None:
            protocol.transport.close()

    def released(self) -> bool:
        """The socket is closed (a TLS connection closes only after its shutdown)."""
        return self._protocol.lost or self._protocol.transport is None

    def abort(self) -> None:
        if self._protocol.transport is not None:
            self._protocol.transport.abort()
