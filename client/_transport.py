"""The transport seam: one protocol whose methods are queue operations, not HTTP verbs.

``Client`` and ``AsyncClient`` only call these methods, so a transport over shared
memory (``client/shm_transport.py``: ``ShmTransport``/``AsyncShmTransport``) plugs in
without touching them. ``open_transport(url)`` picks one by the URL's scheme:
``http(s)://`` → HTTP, ``shm://`` → shared memory. Several comma-separated URLs (or a
list) are the nodes of one replicated deployment: the HTTP transport follows its leader
among them; after a ``shm://`` address they are where the shared-memory transport's
HTTP calls may go when the local server is not the leader. Invariant: transports raise only
``ClientError``s, and batch methods return one ``Outcome`` per input, in order (so does
``dequeue`` for the releases it carries, in ``Dequeued.released``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from dq.client._routing import split_urls
from dq.client.errors import UnsupportedAddress
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
    Release,
    Requeue,
)

__all__ = ["AsyncTransport", "Transport", "open_async_transport", "open_transport"]


@runtime_checkable
class Transport(Protocol):
    def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]: ...
    def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
    ) -> Dequeued: ...
    def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]: ...
    def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]: ...
    def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]: ...
    def list_queues(self) -> list[QueueInfo]: ...
    def get_queue(self, queue: str) -> QueueInfo: ...
    def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo: ...
    def delete_queue(self, queue: str, force: bool = False) -> None: ...
    def health(self) -> dict[str, Any]: ...
    def pause(self, queue: str, resume: bool = False) -> QueueInfo: ...
    def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage: ...
    def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem: ...
    def purge(self, queue: str) -> int: ...
    def delete_item(self, queue: str, item_id: int) -> None: ...
    def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult: ...
    def backup(self, dest: str) -> BackupResult: ...
    def close(self) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol):
    async def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]: ...
    async def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
    ) -> Dequeued: ...
    async def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]: ...
    async def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]: ...
    async def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]: ...
    async def list_queues(self) -> list[QueueInfo]: ...
    async def get_queue(self, queue: str) -> QueueInfo: ...
    async def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo: ...
    async def delete_queue(self, queue: str, force: bool = False) -> None: ...
    async def health(self) -> dict[str, Any]: ...
    async def pause(self, queue: str, resume: bool = False) -> QueueInfo: ...
    async def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage: ...
    async def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem: ...
    async def purge(self, queue: str) -> int: ...
    async def delete_item(self, queue: str, item_id: int) -> None: ...
    async def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult: ...
    async def backup(self, dest: str) -> BackupResult: ...
    async def close(self) -> None: ...


def _shm_class(name: str, url: str) -> Any:
    try:
        module = importlib.import_module("dq.client.shm_transport")
        return getattr(module, name)
    except (ImportError, AttributeError) as exc:
        raise UnsupportedAddress(
            f"{url}: the shared-memory transport ({name}) is not available in this install"
        ) from exc


def _urls(url: str | Sequence[str]) -> tuple[str, list[str]]:
    """The first address and every address (``"a,b"`` or a list: the nodes of one
    replicated deployment, ``docs/client.md``)."""
    urls = split_urls(url)
    first = urls[0]
    if not first.startswith(("http://", "https://", "shm://")):
        raise UnsupportedAddress(f"{first}: expected an http://, https:// or shm:// address")
    for other in urls[1:]:
        if not other.startswith(("http://", "https://")):
            raise UnsupportedAddress(
                f"{other}: the addresses after the first must be http:// or https://"
            )
    return first, urls


def open_transport(url: str | Sequence[str], **options: Any) -> Transport:
    first, urls = _urls(url)
    if first.startswith("shm://"):
        if len(urls) > 1:
            options["http_urls"] = urls[1:]
        transport: Transport = _shm_class("ShmTransport", first)(first, **options)
        return transport
    from dq.client._http import HttpTransport

    return HttpTransport(urls, **options)


def open_async_transport(url: str | Sequence[str], **options: Any) -> AsyncTransport:
    first, urls = _urls(url)
    if first.startswith("shm://"):
        if len(urls) > 1:
            options["http_urls"] = urls[1:]
        transport: AsyncTransport = _shm_class("AsyncShmTransport", first)(first, **options)
        return transport
    from dq.client._http import AsyncHttpTransport

    return AsyncHttpTransport(urls, **options)
