"""The HTTP transports (sync and async) over httpx.

Retries only where safe: a connect failure (the request never reached the server) is
retried for every operation; a 503 or a lost response only for idempotent calls
(queue list/get, health, browse, peek, pause, resume, and an enqueue whose items all
carry a key: the server answers a repeated key with the first item and writes
nothing). Other enqueues, release, requeue, dequeue, extend, purge, delete and redrive
are never resent after the request may have been sent — that could duplicate or
misreport work.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from dq.client import _wire
from dq.client.errors import TransportError
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Enqueued,
    Extend,
    Item,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
    Release,
    Requeue,
)

__all__ = ["AsyncHttpTransport", "HttpTransport"]

_DEFAULT_TIMEOUT = 30.0
_RETRY_BASE_S = 0.05


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    path: str
    body: Any = None
    idempotent: bool = False
    queue: str | None = None
    timeout: float | None = None
    params: dict[str, Any] | None = None


def _q(queue: str) -> str:
    return "/v1/queues/" + quote(queue, safe="")


def _is_retryable(exc: Exception | None, status: int | None, call: _Call) -> bool:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return True
    if not call.idempotent:
        return False
    return status == 503 or isinstance(exc, httpx.TransportError)


def _result(call: _Call, response: httpx.Response) -> Any:
    if response.status_code == 204:
        return None
    try:
        doc = response.json()
    except ValueError:
        doc = response.text
    if response.status_code >= 400:
        raise _wire.error_from_response(response.status_code, doc, call.queue)
    return doc


class _Base:
    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = _DEFAULT_TIMEOUT,
        retries: int = 3,
    ) -> None:
        self.url = url.rstrip("/")
        self.retries = retries
        self._timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _request_timeout(self, call: _Call) -> float:
        return call.timeout if call.timeout is not None else self._timeout

    @staticmethod
    def _enqueue(queue: str, items: Sequence[NewItem]) -> _Call:
        keyed = bool(items) and all(i.key is not None for i in items)
        body = _wire.enqueue_body(items)
        return _Call("POST", _q(queue) + "/items", body, idempotent=keyed, queue=queue)

    @staticmethod
    def _pause(queue: str, resume: bool) -> _Call:
        verb = "/resume" if resume else "/pause"
        return _Call("POST", _q(queue) + verb, idempotent=True, queue=queue)

    @staticmethod
    def _browse(queue: str, state: str, after: str | None, limit: int, values: bool) -> _Call:
        params: dict[str, Any] = {"state": state, "limit": limit}
        if after is not None:
            params["after"] = after
        if values:
            params["values"] = "true"
        return _Call("GET", _q(queue) + "/items", idempotent=True, queue=queue, params=params)

    @staticmethod
    def _peek(queue: str, item_id: int, values: bool) -> _Call:
        params = {"values": "true" if values else "false"}
        path = f"{_q(queue)}/items/{int(item_id)}"
        return _Call("GET", path, idempotent=True, queue=queue, params=params)

    @staticmethod
    def _redrive(queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None) -> _Call:
        body: dict[str, Any] = {}
        if to is not None:
            body["to"] = to
        if ids is not None:
            body["ids"] = list(ids)
        if limit is not None:
            body["limit"] = limit
        return _Call("POST", _q(queue) + "/redrive", body, queue=queue)

    def _dequeue(self, queue: str, count: int, lease_ms: int | None, wait_ms: int) -> _Call:
        body: dict[str, Any] = {"count": count, "wait_ms": wait_ms}
        if lease_ms is not None:
            body["lease_ms"] = lease_ms
        timeout = self._timeout + wait_ms / 1000.0
        return _Call("POST", _q(queue) + "/dequeue", body, queue=queue, timeout=timeout)


class HttpTransport(_Base):
    """Blocking transport; one pooled ``httpx.Client`` (``http_transport``: tests' mock)."""

    def __init__(
        self, url: str, *, http_transport: httpx.BaseTransport | None = None, **options: Any
    ) -> None:
        super().__init__(url, **options)
        self._http = httpx.Client(
            base_url=self.url,
            headers=self._headers,
            timeout=self._timeout,
            transport=http_transport,
        )

    def _send(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    params=call.params,
                    timeout=self._request_timeout(call),
                )
            except httpx.HTTPError as exc:
                if attempt < self.retries and _is_retryable(exc, None, call):
                    attempt += 1
                    time.sleep(_RETRY_BASE_S * 2**attempt)
                    continue
                raise TransportError(f"{call.method} {self.url}{call.path}: {exc!r}") from exc
            if response.status_code == 503 and attempt < self.retries and call.idempotent:
                attempt += 1
                time.sleep(_RETRY_BASE_S * 2**attempt)
                continue
            return _result(call, response)

    def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]:
        return _wire.parse_enqueued(self._send(self._enqueue(queue, items)))

    def dequeue(self, queue: str, count: int, lease_ms: int | None, wait_ms: int) -> list[Item]:
        return _wire.parse_items(self._send(self._dequeue(queue, count, lease_ms, wait_ms)))

    def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/release", _wire.release_body(batch), queue=queue)
        return _wire.parse_outcomes(self._send(call))

    def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/requeue", _wire.requeue_body(batch), queue=queue)
        return _wire.parse_outcomes(self._send(call))

    def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/extend", _wire.extend_body(batch), queue=queue)
        return _wire.parse_outcomes(self._send(call))

    def list_queues(self) -> list[QueueInfo]:
        doc = self._send(_Call("GET", "/v1/queues", idempotent=True))
        return [_wire.parse_queue(q) for q in doc["queues"]]

    def get_queue(self, queue: str) -> QueueInfo:
        return _wire.parse_queue(self._send(_Call("GET", _q(queue), idempotent=True, queue=queue)))

    def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo:
        call = _Call("PUT", _q(queue), _wire.config_body(config), idempotent=True, queue=queue)
        return _wire.parse_queue(self._send(call))

    def delete_queue(self, queue: str) -> None:
        self._send(_Call("DELETE", _q(queue), queue=queue))

    def health(self) -> dict[str, Any]:
        doc: dict[str, Any] = self._send(_Call("GET", "/healthz", idempotent=True))
        return doc

    # operator calls ----------------------------------------------------------------
    def pause(self, queue: str, resume: bool = False) -> QueueInfo:
        return _wire.parse_queue(self._send(self._pause(queue, resume)))

    def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage:
        return _wire.parse_page(self._send(self._browse(queue, state, after, limit, values)))

    def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem:
        return _wire.parse_browsed(self._send(self._peek(queue, item_id, values)))

    def purge(self, queue: str) -> int:
        doc = self._send(_Call("DELETE", _q(queue) + "/items", queue=queue))
        return int(doc["purged"])

    def delete_item(self, queue: str, item_id: int) -> None:
        self._send(_Call("DELETE", f"{_q(queue)}/items/{int(item_id)}", queue=queue))

    def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult:
        return _wire.parse_redrive(self._send(self._redrive(queue, to, ids, limit)))

    def backup(self, dest: str) -> BackupResult:
        return _wire.parse_backup(self._send(_Call("POST", "/v1/backup", {"dest": dest})))

    def close(self) -> None:
        self._http.close()


class AsyncHttpTransport(_Base):
    """Asyncio transport; one pooled ``httpx.AsyncClient``."""

    def __init__(
        self, url: str, *, http_transport: httpx.AsyncBaseTransport | None = None, **options: Any
    ) -> None:
        super().__init__(url, **options)
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=self._headers,
            timeout=self._timeout,
            transport=http_transport,
        )

    async def _send(self, call: _Call) -> Any:
        attempt = 0
        while True:
            try:
                response = await self._http.request(
                    call.method,
                    call.path,
                    json=call.body,
                    params=call.params,
                    timeout=self._request_timeout(call),
                )
            except httpx.HTTPError as exc:
                if attempt < self.retries and _is_retryable(exc, None, call):
                    attempt += 1
                    await asyncio.sleep(_RETRY_BASE_S * 2**attempt)
                    continue
                raise TransportError(f"{call.method} {self.url}{call.path}: {exc!r}") from exc
            if response.status_code == 503 and attempt < self.retries and call.idempotent:
                attempt += 1
                await asyncio.sleep(_RETRY_BASE_S * 2**attempt)
                continue
            return _result(call, response)

    async def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]:
        return _wire.parse_enqueued(await self._send(self._enqueue(queue, items)))

    async def dequeue(
        self, queue: str, count: int, lease_ms: int | None, wait_ms: int
    ) -> list[Item]:
        return _wire.parse_items(await self._send(self._dequeue(queue, count, lease_ms, wait_ms)))

    async def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/release", _wire.release_body(batch), queue=queue)
        return _wire.parse_outcomes(await self._send(call))

    async def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/requeue", _wire.requeue_body(batch), queue=queue)
        return _wire.parse_outcomes(await self._send(call))

    async def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]:
        call = _Call("POST", _q(queue) + "/extend", _wire.extend_body(batch), queue=queue)
        return _wire.parse_outcomes(await self._send(call))

    async def list_queues(self) -> list[QueueInfo]:
        doc = await self._send(_Call("GET", "/v1/queues", idempotent=True))
        return [_wire.parse_queue(q) for q in doc["queues"]]

    async def get_queue(self, queue: str) -> QueueInfo:
        doc = await self._send(_Call("GET", _q(queue), idempotent=True, queue=queue))
        return _wire.parse_queue(doc)

    async def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo:
        call = _Call("PUT", _q(queue), _wire.config_body(config), idempotent=True, queue=queue)
        return _wire.parse_queue(await self._send(call))

    async def delete_queue(self, queue: str) -> None:
        await self._send(_Call("DELETE", _q(queue), queue=queue))

    async def health(self) -> dict[str, Any]:
        doc: dict[str, Any] = await self._send(_Call("GET", "/healthz", idempotent=True))
        return doc

    # operator calls ----------------------------------------------------------------
    async def pause(self, queue: str, resume: bool = False) -> QueueInfo:
        return _wire.parse_queue(await self._send(self._pause(queue, resume)))

    async def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage:
        doc = await self._send(self._browse(queue, state, after, limit, values))
        return _wire.parse_page(doc)

    async def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem:
        return _wire.parse_browsed(await self._send(self._peek(queue, item_id, values)))

    async def purge(self, queue: str) -> int:
        doc = await self._send(_Call("DELETE", _q(queue) + "/items", queue=queue))
        return int(doc["purged"])

    async def delete_item(self, queue: str, item_id: int) -> None:
        await self._send(_Call("DELETE", f"{_q(queue)}/items/{int(item_id)}", queue=queue))

    async def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult:
        return _wire.parse_redrive(await self._send(self._redrive(queue, to, ids, limit)))

    async def backup(self, dest: str) -> BackupResult:
        doc = await self._send(_Call("POST", "/v1/backup", {"dest": dest}))
        return _wire.parse_backup(doc)

    async def close(self) -> None:
        await self._http.aclose()
