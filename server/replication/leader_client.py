"""A follower's HTTP client for its leader's replica routes (docs/replication.md).

Used by the follower's own thread. ``pull`` fetches frames (``POST /v1/replica/pull``)
over one kept-alive HTTP/1.1 connection, written and parsed here (one send per request,
the answer read with one buffered reader: a pull is on the path of every replicated
write's acknowledgement, and ``http.client`` costs several times as much CPU per
request). ``snapshot`` streams a snapshot (``POST /v1/replica/snapshot``) with
``http.client`` on a connection of its own. ``abort`` may be called from any other
thread: it shuts the sockets down so a blocked read returns at once (how a follower
stops promptly) and nothing more is sent. Every read has a timeout.

Errors: a non-2xx answer raises ``LeaderRefused`` carrying the status and the error
code of dq's error body (``{"error": code, "message": text}``); a network failure raises
``OSError``, a malformed answer ``http.client.HTTPException``.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import urlsplit

__all__ = ["LeaderClient", "LeaderRefused", "Pulled"]

PULL_PATH = "/v1/replica/pull"
#: bounds on what a pull answer may hold (the leader sends about 4 MiB of frames at most)
_MAX_LINE = 64 * 1024
_MAX_HEADERS = 100
_MAX_BODY = 256 << 20
SNAPSHOT_PATH = "/v1/replica/snapshot"


class LeaderRefused(Exception):
    """The leader answered with an error status."""

    def __init__(self, status: int, code: str, message: str, leader: str | None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        #: the leader it named (421 not_leader), if any
        self.leader = leader


@dataclass(frozen=True, slots=True)
class Pulled:
    """One pull's answer: the frames' bytes and the leader's epoch and commit lsn."""

    body: bytes
    epoch: int | None
    commit_lsn: int | None


def _int(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _refusal(response: http.client.HTTPResponse) -> LeaderRefused:
    return _refused(response.status, response.read(64 * 1024), response.getheader("X-DQ-Leader"))


def _refused(status: int, raw: bytes, leader_header: str | None) -> LeaderRefused:
    """dq's error body, ``{"error": code, "message": text}`` (``server/errors.py``)."""
    code, message, leader = "http_error", raw.decode("utf-8", "replace")[:500], None
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            code = doc["error"]
            message = str(doc.get("message", ""))
            named = doc.get("leader")
            leader = named if isinstance(named, str) else None
    return LeaderRefused(status, code, message, leader or leader_header)


class _Answer:
    """One HTTP/1.1 answer read off a pull connection: status, headers, body."""

    __slots__ = ("body", "headers", "status", "will_close")

    def __init__(self, reader: IO[bytes]) -> None:
        line = reader.readline(_MAX_LINE)
        if not line:
            raise http.client.RemoteDisconnected("the leader closed the connection")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise http.client.BadStatusLine(line.decode("latin-1", "replace"))
        self.status = int(parts[1])
        self.headers: dict[bytes, bytes] = {}
        for _ in range(_MAX_HEADERS):
            line = reader.readline(_MAX_LINE)
            if not line:
                raise http.client.IncompleteRead(b"")
            if line in (b"\r\n", b"\n"):
                break
            name, _, value = line.partition(b":")
            self.headers[name.strip().lower()] = value.strip()
        else:
            raise http.client.LineTooLong("too many header lines")
        connection = self.headers.get(b"connection", b"").lower()
        self.will_close = connection == b"close" or parts[0] == b"HTTP/1.0"
        if b"chunked" in self.headers.get(b"transfer-encoding", b"").lower():
            self.body = _read_chunked(reader)
        elif b"content-length" in self.headers:
            self.body = _read_exactly(reader, int(self.headers[b"content-length"]))
        else:  # delimited by the end of the connection
            self.body = reader.read(_MAX_BODY + 1)
            self.will_close = True
            if len(self.body) > _MAX_BODY:
                raise http.client.HTTPException("pull answer too large")

    def header(self, name: bytes) -> str | None:
        value = self.headers.get(name)
        return None if value is None else value.decode("latin-1")


def _read_exactly(reader: IO[bytes], n: int) -> bytes:
    if not 0 <= n <= _MAX_BODY:
        raise http.client.HTTPException(f"bad content-length {n}")
    data = reader.read(n)
    if len(data) < n:
        raise http.client.IncompleteRead(data, n - len(data))
    return data


def _read_chunked(reader: IO[bytes]) -> bytes:
    out = bytearray()
    while True:
        line = reader.readline(_MAX_LINE)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise http.client.HTTPException(f"bad chunk size line {line!r}") from None
        if size == 0:
            while reader.readline(_MAX_LINE) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return bytes(out)
        if len(out) + size > _MAX_BODY:
            raise http.client.HTTPException("pull answer too large")
        out += _read_exactly(reader, size)
        reader.readline(_MAX_LINE)  # the CRLF after the chunk


class LeaderClient:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._ssl = ssl_context
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        default_port = 443 if self._https else 80
        host = f"[{self._host}]" if ":" in self._host else self._host
        authority = host if self._port in (None, default_port) else f"{host}:{self._port}"
        head = f"POST {self._prefix}{PULL_PATH} HTTP/1.1\r\nHost: {authority}\r\n"
        head += "Content-Type: application/json\r\n"
        if token:
            head += f"Authorization: Bearer {token}\r\n"
        #: the pull request up to its Content-Length (one send per pull, with the body)
        self._pull_head = head.encode("latin-1")
        self._lock = threading.Lock()
        self._open: set[http.client.HTTPConnection] = set()
        #: the kept-alive pull connection: its socket and buffered reader
        self._pull: tuple[socket.socket, IO[bytes]] | None = None
        self._socks: set[socket.socket] = set()
        self._aborted = False

    def _connect(self, timeout_s: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if self._https:
            conn = http.client.HTTPSConnection(
                self._host, self._port, timeout=timeout_s, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
        with self._lock:
            if self._aborted:
                raise ConnectionAbortedError("the follower is stopping")
            self._open.add(conn)
        return conn

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            self._open.discard(conn)
        conn.close()

    def _post(
        self, conn: http.client.HTTPConnection, path: str, body: dict[str, Any]
    ) -> http.client.HTTPResponse:
        if conn.sock is None:
            conn.connect()
        with self._lock:
            # abort() shuts down every socket it sees under this lock: either it has run
            # (and this request is never sent) or it will cut this socket. So once
            # abort() returns, no byte of a new request reaches this leader.
            if self._aborted:
                raise ConnectionAbortedError("this leader is no longer followed")
        conn.request("POST", self._prefix + path, json.dumps(body).encode(), self._headers)
        return conn.getresponse()

    def _open_pull(self, timeout_s: float) -> tuple[socket.socket, IO[bytes]]:
        """A new connection for pulls. Pulls skip ``http.client``: its request and header
        handling costs several times this (about 270 against 40 µs of CPU per pull here),
        and a pull is on the path of every replicated write's acknowledgement."""
        sock = socket.create_connection(
            (self._host, self._port or (443 if self._https else 80)), timeout_s
        )
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._https:
                context = self._ssl or ssl.create_default_context()
                sock = context.wrap_socket(sock, server_hostname=self._host)
            with self._lock:
                # abort() shuts down every socket it sees under this lock: either it has
                # run (this one is never used) or it will cut this one
                if self._aborted:
                    raise ConnectionAbortedError("this leader is no longer followed")
                self._socks.add(sock)
        except BaseException:
            sock.close()
            raise
        return sock, sock.makefile("rb")

    def _drop_pull(self) -> None:
        pull, self._pull = self._pull, None
        if pull is not None:
            sock, reader = pull
            with self._lock:
                self._socks.discard(sock)
            reader.close()
            sock.close()

    def pull(self, node: str, epoch: int, after: int, wait_ms: int) -> Pulled:
        """Frames with lsn > ``after``; ``after`` acknowledges everything up to it."""
        if self._pull is None:
            # the leader holds a pull up to wait_ms before it answers
            self._pull = self._open_pull(self._timeout_s + wait_ms / 1000.0)
        sock, reader = self._pull
        body = json.dumps({"node": node, "epoch": epoch, "after": after, "wait_ms": wait_ms})
        request = self._pull_head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body.encode())
        try:
            with self._lock:
                if self._aborted:
                    raise ConnectionAbortedError("this leader is no longer followed")
            sock.sendall(request)
            answer = _Answer(reader)
        except (OSError, http.client.HTTPException, ValueError):
            self._drop_pull()
            raise
        if answer.will_close:
            self._drop_pull()
        if answer.status != 200:
            raise _refused(answer.status, answer.body, answer.header(b"x-dq-leader"))
        return Pulled(
            answer.body,
            _int(answer.header(b"x-dq-epoch")),
            _int(answer.header(b"x-dq-commit")),
        )

    @contextlib.contextmanager
    def snapshot(self, node: str, epoch: int) -> Iterator[http.client.HTTPResponse]:
        """The leader's snapshot as a readable tar stream (its own connection)."""
        conn = self._connect(self._timeout_s)
        try:
            response = self._post(conn, SNAPSHOT_PATH, {"node": node, "epoch": epoch})
            if response.status != 200:
                raise _refusal(response)
            if not response.chunked and response.length is None:
                # only a framed body tells a complete snapshot from a cut connection
                raise LeaderRefused(200, "protocol", "snapshot body without framing", None)
            yield response
        finally:
            self._drop(conn)

    def abort(self) -> None:
        """From another thread: end every request in flight and refuse new ones; once
        it returns, nothing more is sent to this leader."""
        with self._lock:
            self._aborted = True
            socks = [conn.sock for conn in self._open if conn.sock is not None]
            socks += self._socks
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            conns = list(self._open)
            self._open.clear()
        for conn in conns:
            conn.close()
        pull = self._pull
        if pull is not None:
            with self._lock:
                self._socks.discard(pull[0])
            with contextlib.suppress(OSError):
                pull[1].close()
                pull[0].close()
