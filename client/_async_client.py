"""``AsyncClient``: the asyncio twin of ``Client``, over one ``AsyncTransport``."""

from __future__ import annotations

from collections.abc import Iterable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dq.client._common import as_new_item, as_release, check_outcome
from dq.client._transport import AsyncTransport, open_async_transport
from dq.client.types import (
    Enqueued,
    Extend,
    Item,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    Release,
    Requeue,
)

if TYPE_CHECKING:
    from dq.client.jobs import AsyncConsumer, Backoff

__all__ = ["AsyncClient"]


class AsyncClient:
    """``async with AsyncClient("http://127.0.0.1:8080") as dq: ...``"""

    def __init__(
        self, url: str, *, transport: AsyncTransport | None = None, **options: Any
    ) -> None:
        self.url = url
        self.transport = (
            transport if transport is not None else open_async_transport(url, **options)
        )

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self.transport.close()

    async def enqueue(
        self,
        queue: str,
        value: bytes | str,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
    ) -> int:
        done = await self.transport.enqueue(queue, [as_new_item(value, deadline, delay_ms)])
        return done[0].id

    async def enqueue_many(
        self, queue: str, items: Iterable[bytes | str | NewItem]
    ) -> list[Enqueued]:
        return await self.transport.enqueue(queue, [as_new_item(i) for i in items])

    async def dequeue(
        self, queue: str, count: int = 1, lease_ms: int | None = None, wait_ms: int = 0
    ) -> list[Item]:
        return await self.transport.dequeue(queue, count, lease_ms, wait_ms)

    async def release(self, queue: str, id: int, receipt: str) -> None:
        check_outcome((await self.transport.release(queue, [Release(id, receipt)]))[0], queue)

    async def release_many(self, queue: str, items: Iterable[Item | Release]) -> list[Outcome]:
        return await self.transport.release(queue, [as_release(i) for i in items])

    async def requeue(
        self,
        queue: str,
        id: int,
        receipt: str,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
    ) -> int:
        batch = [Requeue(id, receipt, deadline, delay_ms)]
        outcome = check_outcome((await self.transport.requeue(queue, batch))[0], queue)
        return outcome.deadline if outcome.deadline is not None else 0

    async def requeue_many(self, queue: str, batch: Iterable[Requeue]) -> list[Outcome]:
        return await self.transport.requeue(queue, list(batch))

    async def extend(self, queue: str, id: int, receipt: str, lease_ms: int) -> Outcome:
        outcomes = await self.transport.extend(queue, [Extend(id, receipt, lease_ms)])
        return check_outcome(outcomes[0], queue)

    async def extend_many(self, queue: str, batch: Iterable[Extend]) -> list[Outcome]:
        return await self.transport.extend(queue, list(batch))

    async def queues(self) -> list[QueueInfo]:
        return await self.transport.list_queues()

    async def queue(self, name: str) -> QueueInfo:
        return await self.transport.get_queue(name)

    async def put_queue(self, name: str, config: QueueConfig | None = None) -> QueueInfo:
        return await self.transport.put_queue(name, config if config is not None else QueueConfig())

    async def delete_queue(self, name: str) -> None:
        await self.transport.delete_queue(name)

    async def health(self) -> dict[str, Any]:
        return await self.transport.health()

    def consumer(
        self,
        queue: str,
        *,
        lease_ms: int = 30_000,
        count: int = 1,
        wait_ms: int = 20_000,
        backoff: Backoff | None = None,
    ) -> AsyncConsumer:
        from dq.client.jobs import AsyncConsumer

        return AsyncConsumer(
            self, queue, lease_ms=lease_ms, count=count, wait_ms=wait_ms, backoff=backoff
        )
