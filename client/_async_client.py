"""``AsyncClient``: the asyncio twin of ``Client``: the same calls (``client/_calls.py``),
awaited from one ``AsyncTransport``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dq.client._batches import DEFAULT_MAX_BATCH, Batches
from dq.client._calls import (
    Backup,
    Browse,
    CancelKey,
    DeleteItem,
    DeleteQueue,
    Dequeue,
    EnqueueMany,
    EnqueueOne,
    ExtendMany,
    FailMany,
    GetQueue,
    Groups,
    Health,
    ListQueues,
    PatchKey,
    Pause,
    Peek,
    PeekKey,
    Purge,
    PutQueue,
    Redrive,
    ReleaseMany,
    ReleaseOne,
    RequeueMany,
)
from dq.client._common import as_new_item, as_release, check_outcome
from dq.client._schedules import (
    DeleteSchedule,
    GetSchedule,
    ListSchedules,
    PauseSchedule,
    PutSchedule,
    RunSchedule,
    Schedule,
    ScheduleRun,
    When,
)
from dq.client._transport import AsyncTransport, open_async_transport
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    Fail,
    GroupInfo,
    Item,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
    Release,
    Requeue,
)

if TYPE_CHECKING:
    from dq.client.jobs import AsyncConsumer, Backoff

__all__ = ["AsyncClient"]


class AsyncClient:
    """``async with AsyncClient("http://127.0.0.1:8080") as dq: ...``; the nodes of a
    replicated deployment may be given together, as to ``Client``."""

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        transport: AsyncTransport | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        **options: Any,
    ) -> None:
        #: the address(es) given, comma-separated
        self.url = url if isinstance(url, str) else ",".join(url)
        #: ``*_many`` calls send at most ``max_batch`` items a request (client/_batches.py)
        self.batches = Batches(max_batch)
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
        key: str | None = None,
        group: str | None = None,
        on_duplicate: str = "keep",
    ) -> int:
        """Enqueue one item; returns its id once it is durable. With ``key``, a repeat
        within the queue's dedup window returns the first item's id (safe to retry), or
        with ``on_duplicate="replace"`` gives the key's pending item this value and
        deadline (its id; debounce, ``docs/retries.md``); ``group`` is the item's group,
        which the queue's delivery rules go by (``docs/delivery.md``)."""
        if group is None and on_duplicate == "keep":
            return await self.transport.call(EnqueueOne(queue, value, deadline, delay_ms, key))
        item = as_new_item(value, deadline, delay_ms, key, group, on_duplicate)
        done = await self.transport.call(EnqueueMany(queue, [item]))
        return done[0].id

    async def enqueue_many(
        self, queue: str, items: Iterable[bytes | str | NewItem]
    ) -> list[Enqueued]:
        """Enqueue every value, in order; a list longer than the server takes in one
        request goes as several (``docs/client.md``, "Long lists")."""
        return await self.batches.send_async(
            self.transport.call, partial(EnqueueMany, queue), [as_new_item(i) for i in items]
        )

    async def dequeue(
        self,
        queue: str,
        count: int = 1,
        lease_ms: int | None = None,
        wait_ms: int = 0,
        *,
        release: Iterable[Item | Release] = (),
    ) -> Dequeued:
        """As ``Client.dequeue``, ``release`` included."""
        releases = list(map(as_release, release))
        return await self.transport.call(Dequeue(queue, count, lease_ms, wait_ms, releases))

    async def release(self, queue: str, id: int, receipt: str) -> None:
        await self.transport.call(ReleaseOne(queue, id, receipt))

    async def release_many(self, queue: str, items: Iterable[Item | Release]) -> list[Outcome]:
        return await self.batches.send_async(
            self.transport.call, partial(ReleaseMany, queue), [as_release(i) for i in items]
        )

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
        outcome = check_outcome((await self.transport.call(RequeueMany(queue, batch)))[0], queue)
        return outcome.deadline if outcome.deadline is not None else 0

    async def requeue_many(self, queue: str, batch: Iterable[Requeue]) -> list[Outcome]:
        return await self.batches.send_async(
            self.transport.call, partial(RequeueMany, queue), list(batch)
        )

    async def fail(self, queue: str, id: int, receipt: str, error: str = "") -> int:
        """Hand a leased item back because it failed: it comes back when the queue's
        retry policy says (``docs/retries.md``), keeping ``error`` (up to 4096 bytes of
        UTF-8) as its last error; returns its next deadline."""
        batch = [Fail(id, receipt, error)]
        outcome = check_outcome((await self.transport.call(FailMany(queue, batch)))[0], queue)
        return outcome.deadline if outcome.deadline is not None else 0

    async def fail_many(self, queue: str, batch: Iterable[Fail]) -> list[Outcome]:
        return await self.batches.send_async(
            self.transport.call, partial(FailMany, queue), list(batch)
        )

    async def extend(self, queue: str, id: int, receipt: str, lease_ms: int) -> Outcome:
        outcomes = await self.transport.call(ExtendMany(queue, [Extend(id, receipt, lease_ms)]))
        return check_outcome(outcomes[0], queue)

    async def extend_many(self, queue: str, batch: Iterable[Extend]) -> list[Outcome]:
        return await self.batches.send_async(
            self.transport.call, partial(ExtendMany, queue), list(batch)
        )

    async def queues(self) -> list[QueueInfo]:
        return await self.transport.call(ListQueues())

    async def queue(self, name: str) -> QueueInfo:
        return await self.transport.call(GetQueue(name))

    async def put_queue(self, name: str, config: QueueConfig | None = None) -> QueueInfo:
        return await self.transport.call(
            PutQueue(name, config if config is not None else QueueConfig())
        )

    async def groups(self, queue: str, limit: int = 20) -> list[GroupInfo]:
        """The queue's busiest groups now: those with the most leased and held items
        (``docs/delivery.md``)."""
        return await self.transport.call(Groups(queue, limit))

    async def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete a queue and all its items. A queue other queues name as their
        dead-letter queue is refused (``Conflict``, code ``dead_letter_queue_in_use``)
        unless ``force``."""
        await self.transport.call(DeleteQueue(name, force))

    async def health(self) -> dict[str, Any]:
        return await self.transport.call(Health())

    # operating a queue -------------------------------------------------------------
    async def pause(self, queue: str) -> QueueInfo:
        """Stop handing out items (durably); enqueue, release, requeue, extend go on."""
        return await self.transport.call(Pause(queue))

    async def resume(self, queue: str) -> QueueInfo:
        """Hand out items again; waiting long-polls wake at once."""
        return await self.transport.call(Pause(queue, resume=True))

    async def browse(
        self,
        queue: str,
        state: str = "all",
        after: str | None = None,
        limit: int = 100,
        values: bool = False,
    ) -> BrowsePage:
        """One page of items in (deadline, id) order, without leasing them; ``state``:
        "all", "due", "delayed" or "leased". Pass ``page.next`` as ``after``."""
        return await self.transport.call(Browse(queue, state, after, limit, values))

    async def peek(self, queue: str, id: int, values: bool = True) -> BrowsedItem:
        """Item ``id`` wherever it is; state "gone" once it left the queue."""
        return await self.transport.call(Peek(queue, id, values))

    async def peek_key(self, queue: str, key: str, values: bool = True) -> BrowsedItem:
        """The item ``key`` names, wherever it is (state "gone" once it left the queue);
        ``KeyNotFound`` (404 ``key_not_found``) past the key's window."""
        return await self.transport.call(PeekKey(queue, key, values))

    async def cancel_key(self, queue: str, key: str) -> int:
        """Cancel the pending item ``key`` names; its id. ``Conflict`` (``item_leased``)
        if a consumer has it, ``ItemNotFound`` once it is gone."""
        return await self.transport.call(CancelKey(queue, key))

    async def patch_key(
        self,
        queue: str,
        key: str,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
        value: bytes | str | None = None,
    ) -> Enqueued:
        """Give the pending item ``key`` names a new deadline and/or value: its id and
        the deadline it has now (``Conflict``, ``item_leased``, if a consumer has it)."""
        return await self.transport.call(PatchKey(queue, key, deadline, delay_ms, value))

    async def purge(self, queue: str) -> int:
        """Remove every item (leased ones too: their receipts go stale); how many."""
        return await self.transport.call(Purge(queue))

    async def delete_item(self, queue: str, id: int) -> None:
        """Remove one item without a receipt (``ItemNotFound`` if it is not there)."""
        await self.transport.call(DeleteItem(queue, id))

    async def redrive(
        self,
        queue: str,
        *,
        to: str | None = None,
        ids: Iterable[int] | None = None,
        limit: int | None = None,
    ) -> RedriveResult:
        """Move items of dead-letter queue ``queue`` back where they died (or ``to``)."""
        return await self.transport.call(
            Redrive(queue, to, None if ids is None else list(ids), limit)
        )

    async def backup(self, dest: str) -> BackupResult:
        """A consistent copy of the server's data directory at ``dest`` (a new directory
        inside the server's ``--backup-dir``)."""
        return await self.transport.call(Backup(dest))

    # schedules (docs/schedules.md) ------------------------------------------------
    async def put_schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        at: When | None = None,
        timezone: str = "UTC",
        value: bytes | str = b"",
        group: str | None = None,
        catch_up: str = "latest",
        start: When | None = None,
        end: When | None = None,
        paused: bool = False,
    ) -> Schedule:
        """Create schedule ``name`` of ``queue`` (and the queue), or replace its
        definition, keeping what it fired. Exactly one of ``cron`` (five fields, or six
        with the seconds first, on ``timezone``'s wall clock), ``every_ms`` and ``at``.
        Each tick enqueues one item (``value``, ``group``) whose deadline is the tick and
        key ``schedule:{name}:{tick_ms}``. ``catch_up``: what fires of ticks missed while
        no server ran: "skip", "latest" or "all". Times: ms, ISO 8601 text or
        ``datetime`` (without a zone: a wall-clock time of ``timezone``). A definition
        that cannot fire is ``BadRequest`` (``invalid_schedule``, naming the field)."""
        return await self.transport.call(
            PutSchedule(
                queue,
                name,
                cron=cron,
                every_ms=every_ms,
                at=at,
                timezone=timezone,
                value=value,
                group=group,
                catch_up=catch_up,
                start=start,
                end=end,
                paused=paused,
            )
        )

    async def get_schedule(self, queue: str, name: str) -> Schedule:
        """The schedule: its definition, last tick fired, count and next five runs."""
        return await self.transport.call(GetSchedule(queue, name))

    async def list_schedules(self, queue: str) -> list[Schedule]:
        return await self.transport.call(ListSchedules(queue))

    async def delete_schedule(self, queue: str, name: str) -> None:
        """It fires no more; the items it enqueued stay."""
        await self.transport.call(DeleteSchedule(queue, name))

    async def pause_schedule(self, queue: str, name: str) -> Schedule:
        return await self.transport.call(PauseSchedule(queue, name))

    async def resume_schedule(self, queue: str, name: str) -> Schedule:
        """Fire again from the next tick (the ticks that passed while paused do not)."""
        return await self.transport.call(PauseSchedule(queue, name, resume=True))

    async def run_schedule(self, queue: str, name: str) -> ScheduleRun:
        """Enqueue the schedule's item now, outside its ticks."""
        return await self.transport.call(RunSchedule(queue, name))

    def consumer(
        self,
        queue: str,
        *,
        lease_ms: int = 30_000,
        count: int = 1,
        wait_ms: int = 20_000,
        backoff: Backoff | None = None,
        max_extend_ms: int | None = None,
    ) -> AsyncConsumer:
        from dq.client.jobs import AsyncConsumer

        return AsyncConsumer(
            self,
            queue,
            lease_ms=lease_ms,
            count=count,
            wait_ms=wait_ms,
            backoff=backoff,
            max_extend_ms=max_extend_ms,
        )
