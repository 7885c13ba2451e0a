"""The HTTP transports (sync and async): JSON calls over ``client/_connection.py``.

The one HTTP layer of the client: ``Client``/``AsyncClient`` and the consumer-group
client (``client/groups.py``) all send through ``HttpTransport.call``. Retries only
where safe, by the call's ``idempotent`` flag and the transport's ``RetryPolicy``:
  - a request that never reached the server (the connect or the send failed) is retried
    for every call;
  - a lost answer or a retryable status (503 by default) only for idempotent calls —
    queue list/get/put, health, browse, peek, pause, resume, an enqueue whose items all
    carry a key (the server answers a repeated key with the first item and writes
    nothing), and every call of the consumer-group protocol. Other enqueues, release,
    requeue, dequeue, extend, purge, delete and redrive are never resent once they may
    have reached the server: that could duplicate or misreport work;
  - a follower's refusal (421 ``not_leader``, 503 ``no_leader``) is re-sent to the leader
    for every call: a follower refuses before doing anything;
  - with several nodes, a node that has not answered since its last lost answer is
    first asked who leads (``GET /v1/cluster``, a short timeout): a stalled leader's
    kernel still takes requests, and a call sent there would only time out.

A transport may know several nodes of a replicated deployment (``"http://a:1,http://b:2"``
or a list): ``client/_routing.py`` decides which one each try goes to.
``HttpTransport`` keeps one keep-alive connection per thread and node;
``AsyncHttpTransport`` a small pool per node (one connection per request in flight, idle
ones kept for reuse).
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
import threading
import time
import weakref
from collections.abc import Sequence
from json.encoder import c_make_encoder, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import Any, TypeVar
from urllib.parse import urlencode

from dq.client import _wire
from dq.client._calls import Call, Request
from dq.client._connection import AsyncConnection, Connection, Lost, NotSent, Response
from dq.client._routing import (
    DEFAULT_FAILOVER_S,
    PROBE_PATH,
    Cluster,
    Endpoint,
    RetryPolicy,
    Walk,
    split_urls,
)
from dq.client.errors import ClientError, NotLeaderError, TransportError, Unavailable

__all__ = ["AsyncHttpTransport", "HttpTransport"]

R = TypeVar("R")

_DEFAULT_TIMEOUT = 30.0
_MAX_IDLE = 16  # idle asyncio connections kept for reuse
_CLOSE_WAIT_S = 1.0  # how long closing waits for TLS connections' shutdown


#: the probe a node not confirmed is asked before it gets a call (``client/_routing.py``)
_PROBE = Request("GET", PROBE_PATH, idempotent=True)


#: ``json.dumps(body, separators=(",", ":"))``'s C encoder, made once: ``JSONEncoder``
#: makes a new one per call. No circular-reference check (a body is built here from
#: plain values); otherwise the same text, and the same ``TypeError`` for a value JSON
#: cannot hold.
_ENCODE = (
    c_make_encoder(
        None,
        json.JSONEncoder().default,
        encode_basestring_ascii,
        None,
        ":",
        ",",
        False,
        False,
        True,
    )
    if c_make_encoder is not None
    else None
)
#: ``json.loads``'s scanner, called directly on an answer that is a JSON object
_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _json_bytes(body: Any) -> bytes | None:
    """A call's body as compact JSON bytes; ``None`` for no body."""
    if type(body) is bytes or body is None:
        return body
    if _ENCODE is None:  # no C accelerator in this Python
        return json.dumps(body, separators=(",", ":")).encode()
    return "".join(_ENCODE(body, 0)).encode()


def _loads(body: bytes) -> Any:
    """``json.loads(body)``, skipping its encoding detection and wrappers when ``body``
    starts as a JSON object does (then it is UTF-8): the same value, or the same error
    (anything unusual goes to ``json.loads`` itself)."""
    if body[:2] == b'{"':
        try:
            text = body.decode("utf-8", "surrogatepass")
            doc, end = _SCAN(text, 0)
        except (StopIteration, ValueError):
            pass
        else:
            if end == len(text):
                return doc
    return json.loads(body)


def _redirect(response: Response) -> tuple[bool, str | None] | None:
    """``(True, leader)`` for a follower's 421 (``leader`` may be ``None``), ``(False,
    None)`` for its ``503 no_leader``, ``None`` for any other answer."""
    status = response.status
    if status not in (421, 503):
        return None
    try:
        doc = _loads(response.body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        return (True, None) if status == 421 else None
    if status == 503:
        return (False, None) if doc.get("error") == "no_leader" else None
    leader = doc.get("leader")
    return True, leader if isinstance(leader, str) and leader else None


def _view(response: Response) -> tuple[str | None, str | None]:
    """``(role, leader URL)`` from a ``GET /v1/cluster`` answer; ``(None, None)`` for any
    other answer (an error, a server without that route)."""
    if response.status != 200:
        return None, None
    try:
        doc = _loads(response.body)
    except ValueError:
        return None, None
    if not isinstance(doc, dict) or not isinstance(doc.get("role"), str):
        return None, None
    leader = doc.get("leader")
    url = leader.get("url") if isinstance(leader, dict) else None
    return doc["role"], url if isinstance(url, str) and url else None


def _not_leader(call: Call[Any], walk: Walk, leader: str | None) -> ClientError:
    message = f"{call.method} {call.path}: no leader answered: {walk.story()}"
    if walk.lost is not None:
        return _in_doubt(call, walk, message)
    error = NotLeaderError(421, "not_leader", message, queue=call.queue)
    error.leader = leader
    return error


def _in_doubt(call: Call[Any], walk: Walk, why: str) -> TransportError:
    """The call ends on a refusal, but an earlier try's answer was lost: that try may
    have been carried out, so the outcome is unknown (``TransportError``), never a
    refusal that says nothing was done."""
    return TransportError(
        f"{call.method} {call.path}: outcome unknown: the answer to a try at {walk.lost} "
        f"was lost, and the later tries were refused ({why})"
    )


def _result(call: Call[Any], response: Response) -> Any:
    if response.status == 204:
        return None
    try:
        doc = _loads(response.body)
    except ValueError:
        doc = response.body.decode("utf-8", "replace")
    if response.status >= 300:
        if response.status < 400:  # dq never redirects (a follower answers 421): a proxy
            doc = (
                f"{call.method} {call.path} was redirected, which the client does not "
                "follow: give the address dq is served at (https://?)"
            )
        raise _wire.error_from_response(response.status, doc, call.queue)
    return doc


class _Base:
    def __init__(
        self,
        url: str | Sequence[str],
        *,
        token: str | None = None,
        timeout: float = _DEFAULT_TIMEOUT,
        retries: int = 3,
        retry: RetryPolicy | None = None,
        ssl_context: ssl.SSLContext | None = None,
        failover_s: float = DEFAULT_FAILOVER_S,
    ) -> None:
        urls = split_urls(url)
        self.cluster = Cluster(urls, token, ssl_context)
        self.url = urls[0]
        self.retry = retry if retry is not None else RetryPolicy(retries=retries)
        self.retries = self.retry.retries
        self.failover_s = failover_s
        self._timeout = timeout

    @property
    def urls(self) -> list[str]:
        """Every known node: the URLs given, then those redirects named."""
        return [ep.url for ep in self.cluster.endpoints]

    @property
    def leader(self) -> str:
        """The node the next call starts at (the one that answered last)."""
        return self.cluster.leader.url

    def prefer(self, url: str) -> None:
        """Start the next calls at ``url`` (a leader learnt outside this transport)."""
        self.cluster.prefer(url)

    def _walk(self, endpoint: Endpoint | None, started: float) -> Walk:
        return Walk(self.cluster, self.retry, self.failover_s, endpoint, started)

    def _plain(self, response: Response) -> bool:
        """An answer that ends a first try as it is: no follower's refusal, nothing to
        retry (then no ``Walk`` is made for the call: most calls need none)."""
        status = response.status
        return status != 421 and status != 503 and status not in self.retry.statuses

    @staticmethod
    def _encode(call: Call[Any], ep: Endpoint, body: bytes | None) -> bytes:
        """The request's bytes for node ``ep``; ``body``: the call's JSON, encoded."""
        params = call.params
        query = "?" + urlencode(params) if params else ""
        line = f"{call.method} {ep.base_path}{call.path}{query} HTTP/1.1\r\n".encode()
        if body is None:
            if call.method in ("GET", "DELETE"):
                return line + ep.head + b"\r\n"
            return line + ep.head + b"Content-Length: 0\r\n\r\n"
        return b"%s%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
            line,
            ep.head,
            len(body),
            body,
        )

    def _step(self, call: Call[Any], walk: Walk, response: Response) -> tuple[bool, float | None]:
        """What an answer means for the call: (done, pause before the next try).
        Done: ``_result`` gives the call's result or error. Raises ``NotLeaderError``
        when redirects led nowhere."""
        redirect = _redirect(response)
        if redirect is not None:
            named, leader = redirect
            pause = walk.redirected(leader) if named else walk.no_leader()
            if pause is not None:
                return False, pause
            if not named:
                if walk.lost is not None:
                    raise _in_doubt(call, walk, f"no leader: {walk.story()}")
                return True, None  # the follower's own 503 no_leader
            raise _not_leader(call, walk, leader)
        if response.status in self.retry.statuses and call.idempotent:
            pause = walk.again()
            if pause is None and walk.lost is not None:
                raise _in_doubt(call, walk, f"status {response.status}")
            return pause is None, pause
        walk.answered()
        return True, None

    @staticmethod
    def _unreachable(
        call: Call[Any], walk: Walk, exc: NotSent | Lost, probe: bool = False
    ) -> float:
        """A try that never reached its node, or a probe without an answer."""
        pause = walk.probe_lost(str(exc)) if probe else walk.unreachable(str(exc))
        if pause is None:
            if walk.lost is not None:
                raise _in_doubt(call, walk, f"then no server answered: {walk.story()}") from exc
            raise TransportError(
                f"{call.method} {call.path}: no server answered: {walk.story()}"
            ) from exc
        return pause

    @staticmethod
    def _lost(call: Call[Any], walk: Walk, exc: Lost) -> float:
        url = walk.endpoint.url
        pause = walk.lost_answer(str(exc), call.idempotent)
        if pause is None:
            raise TransportError(f"{call.method} {url}{call.path}: {exc}") from exc
        return pause

    def _probe(self, ep: Endpoint) -> bytes:
        return self._encode(_PROBE, ep, None)

    @staticmethod
    def _probed(call: Call[Any], walk: Walk, response: Response) -> float:
        """What a probe's answer means for the call: the pause before the next try.
        Raises when the rounds are over (followers naming each other, or no leader)."""
        role, leader = _view(response)
        pause = walk.probed(role, leader)
        if pause is not None:
            return pause
        if walk.lost is not None:
            raise _in_doubt(call, walk, f"no leader: {walk.story()}")
        if role == "follower" and leader:
            raise _not_leader(call, walk, leader)
        raise Unavailable(
            503,
            "no_leader",
            f"{call.method} {call.path}: no node knows a leader: {walk.story()}",
            queue=call.queue,
        )


class HttpTransport(_Base):
    """Blocking transport: one keep-alive connection per thread and node."""

    def __init__(self, url: str | Sequence[str], **options: Any) -> None:
        super().__init__(url, **options)
        self._local = threading.local()
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._lock = threading.Lock()

    def _connection(self, ep: Endpoint, timeout: float) -> Connection:
        conns: dict[str, Connection] | None = getattr(self._local, "conns", None)
        if conns is None:
            conns = self._local.conns = {}
        conn = conns.get(ep.url)
        if conn is not None and conn.usable():
            return conn
        if conn is not None:
            conn.close()
        conn = Connection(ep.host, ep.port, timeout, ep.tls)
        conns[ep.url] = conn
        with self._lock:
            self._connections.add(conn)
        return conn

    def call(self, call: Call[R]) -> R:
        """Send ``call`` (retrying and following redirects as the module docstring
        says); its result, ``call.decode`` of the answer (or the error it raises)."""
        timeout = self._timeout + call.wait_ms / 1000.0 if call.wait_ms else self._timeout
        body = _json_bytes(call.json())  # once for all the tries
        ep = self.cluster.leader
        started = time.monotonic()
        walk: Walk | None = None if ep.confirmed else self._walk(None, started)
        while True:
            if walk is not None and walk.probing:
                wait = walk.probe_timeout(timeout)
                try:
                    answer = self._connection(ep, wait).request(self._probe(ep), wait)
                except (NotSent, Lost) as exc:
                    pause = self._unreachable(call, walk, exc, isinstance(exc, Lost))
                else:
                    pause = self._probed(call, walk, answer)
                if pause > 0:
                    time.sleep(pause)
                ep = walk.endpoint
                continue
            try:
                response = self._connection(ep, timeout).request(
                    self._encode(call, ep, body), timeout
                )
            except NotSent as exc:
                walk = walk or self._walk(ep, started)
                pause = self._unreachable(call, walk, exc)
            except Lost as exc:
                walk = walk or self._walk(ep, started)
                pause = self._lost(call, walk, exc)
            else:
                if walk is None and self._plain(response):
                    self.cluster.answered_by(ep)
                    return call.decode(_result(call, response))
                walk = walk or self._walk(ep, started)
                done, next_pause = self._step(call, walk, response)
                if done:
                    return call.decode(_result(call, response))
                assert next_pause is not None
                pause = next_pause
            if pause > 0:
                time.sleep(pause)
            ep = walk.endpoint

    def close(self) -> None:
        """Close every thread's connection."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            conn.close()


class _Slots:
    """At most ``n`` requests in flight, the others waiting their turn in order: what
    ``asyncio.Semaphore`` does, without its two coroutines (acquire, release) per request."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, n: int) -> None:
        self._free = n
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def take(self) -> asyncio.Future[None] | None:
        """``None``: a slot is taken. Else a future to await: done once a slot is handed
        over (the caller then holds it, even if cancelled right after)."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    def give(self) -> None:
        """A slot back: to the first caller still waiting, else to the free ones."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class AsyncHttpTransport(_Base):
    """Asyncio transport: a connection per request in flight, idle ones reused (per node)."""

    def __init__(
        self, url: str | Sequence[str], *, max_connections: int = 100, **options: Any
    ) -> None:
        super().__init__(url, **options)
        self._idle: dict[str, list[AsyncConnection]] = {}
        self._busy: set[AsyncConnection] = set()
        self._slots = _Slots(max_connections)

    async def _request(self, ep: Endpoint, data: bytes, timeout: float) -> Response:
        slots = self._slots
        waiter = slots.take()
        if waiter is not None:
            try:
                await waiter
            except asyncio.CancelledError:
                if not waiter.cancelled():  # a slot was handed over: pass it on
                    slots.give()
                raise
        try:
            conn: AsyncConnection | None = None
            idle = self._idle.get(ep.url)
            if idle is None:
                idle = self._idle[ep.url] = []
            while idle:
                candidate = idle.pop()
                if candidate.usable():
                    conn = candidate
                    break
                candidate.close()
            if conn is None:
                conn = await AsyncConnection.open(ep.host, ep.port, timeout, ep.tls)
            self._busy.add(conn)
            try:
                response = await conn.request(data, timeout)
            finally:
                self._busy.discard(conn)
            if conn.usable() and len(idle) < _MAX_IDLE:
                idle.append(conn)
            else:
                conn.close()
            return response
        finally:
            slots.give()

    async def call(self, call: Call[R]) -> R:
        """As ``HttpTransport.call``."""
        timeout = self._timeout + call.wait_ms / 1000.0 if call.wait_ms else self._timeout
        body = _json_bytes(call.json())  # once for all the tries
        ep = self.cluster.leader
        started = time.monotonic()
        walk: Walk | None = None if ep.confirmed else self._walk(None, started)
        while True:
            if walk is not None and walk.probing:
                wait = walk.probe_timeout(timeout)
                try:
                    answer = await self._request(ep, self._probe(ep), wait)
                except (NotSent, Lost) as exc:
                    pause = self._unreachable(call, walk, exc, isinstance(exc, Lost))
                else:
                    pause = self._probed(call, walk, answer)
                if pause > 0:
                    await asyncio.sleep(pause)
                ep = walk.endpoint
                continue
            try:
                response = await self._request(ep, self._encode(call, ep, body), timeout)
            except NotSent as exc:
                walk = walk or self._walk(ep, started)
                pause = self._unreachable(call, walk, exc)
            except Lost as exc:
                walk = walk or self._walk(ep, started)
                pause = self._lost(call, walk, exc)
            else:
                if walk is None and self._plain(response):
                    self.cluster.answered_by(ep)
                    return call.decode(_result(call, response))
                walk = walk or self._walk(ep, started)
                done, next_pause = self._step(call, walk, response)
                if done:
                    return call.decode(_result(call, response))
                assert next_pause is not None
                pause = next_pause
            if pause > 0:
                await asyncio.sleep(pause)
            ep = walk.endpoint

    async def close(self) -> None:
        """Close every connection and wait (at most ``_CLOSE_WAIT_S``) until their sockets
        are: a TLS connection closes only after its shutdown exchange, and a loop that
        ends first leaves it open. One still open then is aborted."""
        conns = [*(c for idle in self._idle.values() for c in idle), *self._busy]
        for conn in conns:
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # a plain connection is released on the next loop turn
        give_up = time.monotonic() + _CLOSE_WAIT_S
        while any(not c.released() for c in conns) and time.monotonic() < give_up:
            await asyncio.sleep(0.005)
        for conn in conns:
            if not conn.released():
                conn.abort()
