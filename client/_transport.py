"""The transport seam: one method, ``call``, that carries any operation.

``Client`` and ``AsyncClient`` build each operation as a ``Call`` (``client/_calls.py``:
its path, its body, how its answer decodes) and hand it to ``transport.call(call)``, as
httpx hands a request to a transport's ``handle_request``; the call's result comes back,
or its error is raised. So a transport over shared memory (``client/shm_transport.py``:
``ShmTransport``/``AsyncShmTransport``) plugs in without touching the clients, and one
that wraps another (a test counting calls, say) is a few lines. ``open_transport(url)``
picks one by the URL's scheme: ``http(s)://`` → HTTP, ``shm://`` → shared memory. Several
comma-separated URLs (or a list) are the nodes of one replicated deployment: the HTTP
transport follows its leader among them; after a ``shm://`` address they are where the
shared-memory transport's HTTP calls may go when the local server is not the leader.
Invariant: transports raise only ``ClientError``s (and the ``TypeError`` of a value JSON
cannot hold), and batch calls give one ``Outcome`` per input, in order (so does a
dequeue for the releases it carries, in ``Dequeued.released``).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from dq.client._calls import Call
from dq.client._routing import split_urls
from dq.client.errors import UnsupportedAddress

__all__ = ["AsyncTransport", "Transport", "open_async_transport", "open_transport"]


R = TypeVar("R")


@runtime_checkable
class Transport(Protocol):
    def call(self, call: Call[R]) -> R:
        """Carry out ``call``: its result, or the ``ClientError`` it ends in."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol):
    async def call(self, call: Call[R]) -> R:
        """As ``Transport.call``, awaited."""
        ...

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
