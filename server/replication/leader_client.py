"""A follower's HTTP client for its leader's replica routes (docs/replication.md).

Blocking ``http.client`` over one kept-alive connection, used by the follower's own
thread: ``pull`` fetches frames (``POST /v1/replica/pull``), ``snapshot`` streams a
snapshot (``POST /v1/replica/snapshot``, on a connection of its own). ``abort`` may be
called from any other thread: it shuts the socket down so a blocked read returns at
once (how a follower stops promptly). Every read has a timeout.

Errors: a non-2xx answer raises ``LeaderRefused`` carrying the status and the error
code of dq's error body (``{"error": code, "message": text}``); a network failure raises ``OSError`` or
``http.client.HTTPException``, as ``http.client`` does.
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
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LeaderClient", "LeaderRefused", "Pulled"]

PULL_PATH = "/v1/replica/pull"
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


def _int_header(response: http.client.HTTPResponse, name: str) -> int | None:
    value = response.getheader(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _refusal(response: http.client.HTTPResponse) -> LeaderRefused:
    """dq's error body, ``{"error": code, "message": text}`` (``server/errors.py``)."""
    raw = response.read(64 * 1024)
    code, message, leader = "http_error", raw.decode("utf-8", "replace")[:500], None
    with contextlib.suppress(ValueError):
        doc = json.loads(raw)
        if isinstance(doc, dict) and isinstance(doc.get("error"), str):
            code = doc["error"]
            message = str(doc.get("message", ""))
            named = doc.get("leader")
            leader = named if isinstance(named, str) else None
    leader = leader or response.getheader("X-DQ-Leader")
    return LeaderRefused(response.status, code, message, leader)


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
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None
        self._open: set[http.client.HTTPConnection] = set()
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
            if self._conn is conn:
                self._conn = None
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

    def pull(self, node: str, epoch: int, after: int, wait_ms: int) -> Pulled:
        """Frames with lsn > ``after``; ``after`` acknowledges everything up to it."""
        conn = self._conn
        if conn is None:
            # the leader holds a pull up to wait_ms before it answers
            conn = self._conn = self._connect(self._timeout_s + wait_ms / 1000.0)
        body = {"node": node, "epoch": epoch, "after": after, "wait_ms": wait_ms}
        try:
            response = self._post(conn, PULL_PATH, body)
            if response.status != 200:
                refused = _refusal(response)
                if response.will_close:
                    self._drop(conn)
                raise refused
            pulled = Pulled(
                response.read(),
                _int_header(response, "X-DQ-Epoch"),
                _int_header(response, "X-DQ-Commit"),
            )
            if response.will_close:
                self._drop(conn)
            return pulled
        except (OSError, http.client.HTTPException):
            self._drop(conn)
            raise

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
            conns = list(self._open)
        for conn in conns:
            sock = conn.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with self._lock:
            conns = list(self._open)
            self._open.clear()
            self._conn = None
        for conn in conns:
            conn.close()
