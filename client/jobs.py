"""Consumer helpers: iterate due items, keep their leases alive, release or requeue.

    with Client(url) as dq:
        for job in dq.consumer("emails").jobs(stop=stop_event):
            with job:                  # extends the lease while the block runs
                send(job.item.value)   # clean exit → release; exception → fail

``max_extend_ms`` caps how long one job's lease is kept alive: past it the helper
stops extending (and logs it), the lease runs out, and the item is delivered again —
so a handler that hangs does not hold its item forever (the queue's
``oldest_lease_age_ms`` shows such a job either way).

A failed job is failed (``Client.fail``): the exception's type and message become the
item's last error, and the queue's retry policy sets when it comes back
(``docs/retries.md``); with a ``Backoff`` given instead, the job is requeued with that
exponential backoff, computed here, keyed on the item's ``dequeue_count`` (what the
helper did before queues had retry policies). The exception is logged, not re-raised,
so the loop goes on.

One request per item: a finished job is not released by a request of its own; its
release rides on the consumer's next dequeue (``dequeue(..., release=...)``), and
whatever is still unreleased when the loop ends is released then (``flush``). So the
work done between two jobs must stay shorter than the lease (it always is inside
``run``); a release that comes too late fails as a stale receipt, counts as ``lost``,
and the item is delivered again. With ``count`` > 1 the next job of a batch may run
for longer than the lease, so the releases waiting then are sent before it starts,
and the batch's jobs that wait their turn have their leases kept from the dequeue on.

A server that cannot be reached or answers 503 (a restart, a deploy, a worker started
before its server) does not end the loop: the dequeue is logged and tried again, 0.1 s
doubling to 5 s apart, until ``stop``; items a lost dequeue leased come back when their
lease runs out. Any other error (a bad token, a bad argument) ends it. A queue that does
not exist is waited on too (a worker may start before its producer), and said once, as
a warning in the log: a misspelled name would otherwise wait in silence.

Invariant: a job's receipt is only used under its lock, so an extension that renews
the receipt and the final release/requeue never race.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from dq.client.errors import ClientError, Conflict, NotFound, TransportError, Unavailable
from dq.client.types import Dequeued, Release

if TYPE_CHECKING:
    from dq.client._async_client import AsyncClient
    from dq.client._client import Client
    from dq.client.types import Item, Outcome

__all__ = [
    "AsyncConsumer",
    "AsyncJob",
    "Backoff",
    "Consumer",
    "ConsumerStats",
    "Job",
    "error_text",
]

#: the longest error a fail carries (bytes of UTF-8): the server's limit
MAX_ERROR_BYTES = 4096


def error_text(exc: BaseException | None) -> str:
    """What a failed job tells the server: ``Type: message``, cut to 4096 bytes of UTF-8
    at a character boundary."""
    if exc is None:
        return ""
    message = str(exc)
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    raw = text.encode("utf-8", "replace")
    if len(raw) <= MAX_ERROR_BYTES:
        return raw.decode("utf-8")
    return raw[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before the n-th retry: ``base_ms * factor**(n-1)``, capped, ± ``jitter``."""

    base_ms: int = 1_000
    factor: float = 2.0
    max_ms: int = 300_000
    jitter: float = 0.1

    def delay_ms(self, attempt: int) -> int:
        raw = min(float(self.max_ms), self.base_ms * self.factor ** max(0, attempt - 1))
        spread = raw * self.jitter
        return max(0, int(raw + random.uniform(-spread, spread)))


@dataclass(slots=True)
class ConsumerStats:
    released: int = 0
    #: jobs that raised, handed back under the queue's retry policy
    failed: int = 0
    #: jobs that raised, requeued with the consumer's own ``Backoff``
    requeued: int = 0
    lost: int = 0  # the lease ended before we finished; the item comes back to someone

    def count_releases(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if outcome.ok:
                self.released += 1
            else:
                self.lost += 1
                logger.warning("lease of item %s was lost; it will be redelivered", outcome.id)


class _JobState:
    """Shared by the sync and async jobs: the current receipt and how the job ended."""

    def __init__(
        self,
        queue: str,
        item: Item,
        lease_ms: int,
        backoff: Backoff | None,
        settled: list[Release] | None = None,
        max_extend_ms: int | None = None,
    ) -> None:
        self.queue = queue
        self.item = item
        self.receipt = item.receipt
        self.lease_ms = lease_ms
        self.backoff = backoff
        self.lost = False
        self._settled = settled  # where a finished job leaves its release, if deferred
        self.max_extend_ms = max_extend_ms
        self._started = time.monotonic()

    def may_extend(self) -> bool:
        """False once the job has been extended for ``max_extend_ms`` (logged once)."""
        if self.max_extend_ms is None:
            return True
        if (time.monotonic() - self._started) * 1000 < self.max_extend_ms:
            return True
        logger.warning(
            "item %s of queue %s: stopped extending its lease after %d ms "
            "(max_extend_ms); it will be delivered again when the lease runs out",
            self.item.id,
            self.queue,
            self.max_extend_ms,
        )
        return False

    @property
    def extend_every_s(self) -> float:
        return max(0.05, self.lease_ms / 3000.0)

    def retry_delay_ms(self) -> int:
        assert self.backoff is not None
        return self.backoff.delay_ms(self.item.stats.dequeue_count)


_LINGER_S = 1.0  # how long the keeper starter waits for more jobs before it sleeps for good
#: a dequeue the server could not answer is tried again this long after, doubling to the max
_OUTAGE_FIRST_S = 0.1
_OUTAGE_MAX_S = 5.0
#: errors a worker loop waits out: the server is away or busy, not the request wrong
_OUTAGE = (TransportError, Unavailable)


def _outage(queue: str, exc: ClientError, pause: float) -> float:
    """Log a dequeue the server could not answer; the next pause."""
    logger.warning("dequeue from %s failed (%s); trying again in %.1f s", queue, exc, pause)
    return min(_OUTAGE_MAX_S, pause * 2)


class _KeeperStarter:
    """Starts a job's lease keeper (a thread) only once the job has run for one extension
    period. Most jobs end long before their first extension, and a thread started and
    stopped per job cost more CPU than the job's requests; a job that runs longer gets
    its own keeper as before, extending its lease at the same times. One per process,
    on one thread that wakes when the earliest job it holds falls due."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """As new; after ``fork()``, in the child: the thread stayed in the parent, its
        lock may have been held there, and the parent's jobs are the parent's to keep."""
        self._lock = threading.Lock()  # taken directly: cheaper than the condition's methods
        self._cond = threading.Condition(self._lock)
        self._jobs: dict[int, tuple[float, Job]] = {}  # id(job) → (when it falls due, job)
        self._wake_at = math.inf  # when the thread looks next (inf: when told)
        self._thread: threading.Thread | None = None

    def add(self, job: Job, due: float) -> None:
        with self._lock:
            self._jobs[id(job)] = (due, job)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dq-lease-starter", daemon=True
                )
                self._thread.start()
            elif due < self._wake_at:
                self._cond.notify()

    def remove(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(id(job), None)

    def _run(self) -> None:
        lingered = False
        with self._cond:
            while True:
                now = time.monotonic()
                for key, (due, job) in list(self._jobs.items()):
                    if due <= now:
                        del self._jobs[key]
                        try:
                            job.start_keeper()
                        except Exception:  # no thread to be had: the lease may run out
                            logger.exception("cannot keep the lease of item %s", job.item.id)
                if self._jobs:
                    self._wake_at = min(due for due, _ in self._jobs.values())
                    lingered = False
                elif not lingered:
                    self._wake_at = now + _LINGER_S
                    lingered = True
                else:
                    self._wake_at = math.inf
                self._cond.wait(None if self._wake_at == math.inf else self._wake_at - now)


_starter = _KeeperStarter()
os.register_at_fork(after_in_child=_starter.reset)


class Job(_JobState):
    """One leased item; ``with job:`` keeps the lease and settles the item at exit."""

    def __init__(self, client: Client, queue: str, item: Item, lease_ms: int,
                 backoff: Backoff | None, stats: ConsumerStats,
                 settled: list[Release] | None = None,
                 max_extend_ms: int | None = None) -> None:  # fmt: skip
        super().__init__(queue, item, lease_ms, backoff, settled, max_extend_ms)
        self._client = client
        self._stats = stats
        self._lock = threading.Lock()
        self._done = False  # the job ended (read by its keeper under ``_lock``)
        #: wakes the keeper when the job ends; made with the keeper (most jobs have none)
        self._ended: threading.Event | None = None
        self._keeper: threading.Thread | None = None
        self._kept = False  # given to the keeper starter

    def keep(self, since: float | None = None) -> None:
        """Keep the lease from ``since`` (monotonic; now if None) on, whether the job
        has started or not: ``Consumer.jobs`` keeps a batch's jobs from their dequeue,
        as the later ones wait while the earlier ones run."""
        if not self._kept:
            start = time.monotonic() if since is None else since
            _starter.add(self, start + self.extend_every_s)
            self._kept = True

    def __enter__(self) -> Job:
        self.keep()
        return self

    def drop(self) -> None:
        """The job will not run (its loop ended first): stop keeping its lease, which
        then runs out and the item is delivered again."""
        if self._kept:
            _starter.remove(self)
        self._done = True
        if self._ended is not None:
            self._ended.set()

    @property
    def ended(self) -> bool:
        return self._done

    def start_keeper(self) -> None:
        """The job's lease is one extension period old: its keeper extends it now,
        then every period (called by ``_KeeperStarter``)."""
        if self._done or self._keeper is not None:
            return
        self._ended = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep, args=(0.0,), name=f"dq-lease-{self.item.id}", daemon=True
        )
        self._keeper.start()

    def _keep(self, first_wait: float) -> None:
        ended = self._ended
        assert ended is not None
        wait = first_wait
        while not ended.wait(wait):
            wait = self.extend_every_s
            with self._lock:
                if self._done or not self.may_extend():
                    return
                try:
                    out = self._client.extend(self.queue, self.item.id, self.receipt, self.lease_ms)
                except (Conflict, NotFound):
                    self.lost = True
                    return
                except ClientError as exc:  # transient: try again next period
                    logger.warning("extending lease of item %s failed: %s", self.item.id, exc)
                    continue
                if out.receipt:
                    self.receipt = out.receipt

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if self._kept:
            # after this the starter gives the job no keeper; one it gave is in _ended
            _starter.remove(self)
        self._done = True
        if self._ended is not None:
            self._ended.set()
        with self._lock:
            if self._keeper is not None:
                self._keeper.join(timeout=0)
            if t is not None and not issubclass(t, Exception):
                return False  # KeyboardInterrupt/SystemExit: the lease will run out
            self._settle(failed=t is not None, error=e)
        return True

    def _settle(self, *, failed: bool, error: BaseException | None) -> None:
        try:
            if not failed:
                if self._settled is not None:
                    self._settled.append(Release(self.item.id, self.receipt))
                    return
                self._client.release(self.queue, self.item.id, self.receipt)
                self._stats.released += 1
                return
            if self.backoff is None:
                why = error_text(error)
                deadline = self._client.fail(self.queue, self.item.id, self.receipt, why)
                logger.warning("job %s failed (%s); back at %d", self.item.id, why, deadline)
                self._stats.failed += 1
                return
            delay = self.retry_delay_ms()
            logger.warning("job %s failed (%r); requeued in %d ms", self.item.id, error, delay)
            self._client.requeue(self.queue, self.item.id, self.receipt, delay_ms=delay)
            self._stats.requeued += 1
        except (Conflict, NotFound):
            self._stats.lost += 1
            logger.warning("lease of item %s was lost; it will be redelivered", self.item.id)
        except _OUTAGE as exc:  # the loop waits the outage out; the lease runs out
            self._stats.lost += 1
            logger.warning("item %s not settled (%s); it will be redelivered", self.item.id, exc)


class _MissingQueue:
    """Says once, in the log, that a consumer's queue does not exist: a worker may start
    before its producer, but one waiting on a misspelled name would otherwise wait in
    silence forever."""

    __slots__ = ("told",)

    def __init__(self) -> None:
        self.told = False

    def note(self, queue: str, got: Dequeued) -> None:
        if not got.queue_exists and not self.told:
            self.told = True
            logger.warning(
                "queue %s does not exist (yet): waiting for a producer to create it "
                "(is the name right?)",
                queue,
            )


class _ConsumerState:
    """Shared by ``Consumer`` and ``AsyncConsumer``: the settings, the counts, and the
    finished jobs whose release waits for the next dequeue (or ``flush``). Each makes
    its calls around this its own way, blocking or awaited."""

    def __init__(self, queue: str, lease_ms: int, count: int, wait_ms: int,
                 backoff: Backoff | None, max_extend_ms: int | None) -> None:  # fmt: skip
        self.queue = queue
        self.lease_ms = lease_ms
        self.max_extend_ms = max_extend_ms
        self.count = count
        self.wait_ms = wait_ms
        #: None: a failed job is failed, the queue's retry policy decides when it is back
        self.backoff = backoff
        self.stats = ConsumerStats()
        self._settled: list[Release] = []  # released by the next dequeue (or ``flush``)
        self._missing = _MissingQueue()

    def _waiting(self) -> list[Release]:
        """The finished jobs' releases, taken out of the list: a call that fails to
        release them puts them back (``self._settled[:0] = done``) to try again."""
        done, self._settled[:] = list(self._settled), []
        return done

    def _taken(self, got: Dequeued) -> list[Item]:
        """What a dequeue answered: the releases it carried counted, a queue that does
        not exist yet said once."""
        self._missing.note(self.queue, got)
        self.stats.count_releases(got.released)
        return got


class Consumer(_ConsumerState):
    """Pulls items from one queue through a ``Client`` (see the module docstring)."""

    def __init__(self, client: Client, queue: str, *, lease_ms: int = 30_000, count: int = 1,
                 wait_ms: int = 20_000, backoff: Backoff | None = None,
                 max_extend_ms: int | None = None) -> None:  # fmt: skip
        self.client = client
        super().__init__(queue, lease_ms, count, wait_ms, backoff, max_extend_ms)

    def jobs(
        self, *, stop: threading.Event | None = None, max_items: int | None = None
    ) -> Iterator[Job]:
        seen = 0
        pause = _OUTAGE_FIRST_S
        try:
            while (stop is None or not stop.is_set()) and (max_items is None or seen < max_items):
                want = self.count if max_items is None else min(self.count, max_items - seen)
                try:
                    items = self._take(want)
                except _OUTAGE as exc:
                    wait = pause
                    pause = _outage(self.queue, exc, wait)
                    if stop is not None:
                        stop.wait(wait)
                    else:
                        time.sleep(wait)
                    continue
                pause = _OUTAGE_FIRST_S
                taken = time.monotonic()
                batch = [Job(self.client, self.queue, item, self.lease_ms, self.backoff,
                             self.stats, self._settled, self.max_extend_ms)
                         for item in items]  # fmt: skip
                for job in batch:
                    job.keep(since=taken)  # the later ones wait while the earlier ones run
                try:
                    for n, job in enumerate(batch):
                        if n and self._settled:  # this job may outlast their leases
                            self._release_waiting()
                        seen += 1
                        yield job
                finally:
                    for job in batch:
                        if not job.ended:  # never run (the loop was left): not kept
                            job.drop()
        finally:
            self._flush_quietly()

    def _take(self, count: int) -> list[Item]:
        done = self._waiting()
        try:
            items = self.client.dequeue(
                self.queue, count, self.lease_ms, self.wait_ms, release=done
            )
        except ClientError:
            self._settled[:0] = done  # they may not have been released: try again
            raise
        return self._taken(items)

    def flush(self) -> None:
        """Release the finished jobs whose release is still waiting for a dequeue."""
        done = self._waiting()
        if done:
            self.stats.count_releases(self.client.release_many(self.queue, done))

    def _flush_quietly(self) -> None:
        try:
            self.flush()
        except ClientError as exc:
            logger.warning("releasing finished jobs failed (they will be redelivered): %s", exc)

    def _release_waiting(self) -> None:
        """Before the next job of a batch: release the finished ones. While the server
        is away they keep waiting (for the next job or the next dequeue), as ``_take``
        keeps them."""
        done = self._waiting()
        try:
            self.stats.count_releases(self.client.release_many(self.queue, done))
        except _OUTAGE as exc:
            self._settled[:0] = done
            logger.warning("releasing finished jobs failed (tried again later): %s", exc)
        except ClientError as exc:
            logger.warning("releasing finished jobs failed (they will be redelivered): %s", exc)

    def run(self, handler: Callable[[Item], object], *, stop: threading.Event | None = None,
            max_items: int | None = None) -> ConsumerStats:  # fmt: skip
        """Call ``handler(item)`` for each item until ``stop`` is set or ``max_items`` ran."""
        for job in self.jobs(stop=stop, max_items=max_items):
            with job:
                handler(job.item)
        return self.stats


class AsyncJob(_JobState):
    """``async with job:`` — the asyncio twin of ``Job`` (the lease keeper is a task)."""

    def __init__(self, client: AsyncClient, queue: str, item: Item, lease_ms: int,
                 backoff: Backoff | None, stats: ConsumerStats,
                 settled: list[Release] | None = None,
                 max_extend_ms: int | None = None) -> None:  # fmt: skip
        super().__init__(queue, item, lease_ms, backoff, settled, max_extend_ms)
        self._client = client
        self._stats = stats
        self._lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.ended = False

    def keep(self, since: float | None = None) -> None:
        """Keep the lease from ``since`` (the loop's time; now if None) on, started or
        not (``AsyncConsumer.jobs``: a batch's later jobs wait while earlier ones run)."""
        # the keeper task starts once the lease is one extension period old: most jobs
        # end before, and a task made and cancelled per job costs several loop turns
        if self._timer is None and self._keeper is None and not self.ended:
            loop = asyncio.get_running_loop()
            start = loop.time() if since is None else since
            self._timer = loop.call_at(start + self.extend_every_s, self._start_keeper)

    async def __aenter__(self) -> AsyncJob:
        self.keep()
        return self

    async def drop(self) -> None:
        """The job will not run (its loop ended first): stop keeping its lease."""
        self.ended = True
        await self._stop_keeping()

    async def _stop_keeping(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._keeper is not None:
            self._keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keeper

    def _start_keeper(self) -> None:
        self._timer = None
        self._keeper = asyncio.create_task(self._keep(0.0))

    async def _keep(self, first_wait: float) -> None:
        wait = first_wait
        while True:
            await asyncio.sleep(wait)
            wait = self.extend_every_s
            async with self._lock:
                if not self.may_extend():
                    return
                try:
                    out = await self._client.extend(
                        self.queue, self.item.id, self.receipt, self.lease_ms
                    )
                except (Conflict, NotFound):
                    self.lost = True
                    return
                except ClientError as exc:
                    logger.warning("extending lease of item %s failed: %s", self.item.id, exc)
                    continue
                if out.receipt:
                    self.receipt = out.receipt

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> bool:
        self.ended = True
        await self._stop_keeping()
        if t is not None and not issubclass(t, Exception):
            return False
        async with self._lock:
            try:
                if t is None and self._settled is not None:
                    self._settled.append(Release(self.item.id, self.receipt))
                elif t is None:
                    await self._client.release(self.queue, self.item.id, self.receipt)
                    self._stats.released += 1
                elif self.backoff is None:
                    why = error_text(e)
                    deadline = await self._client.fail(self.queue, self.item.id, self.receipt, why)
                    logger.warning("job %s failed (%s); back at %d", self.item.id, why, deadline)
                    self._stats.failed += 1
                else:
                    delay = self.retry_delay_ms()
                    logger.warning("job %s failed (%r); requeued in %d ms", self.item.id, e, delay)
                    await self._client.requeue(
                        self.queue, self.item.id, self.receipt, delay_ms=delay
                    )
                    self._stats.requeued += 1
            except (Conflict, NotFound):
                self._stats.lost += 1
                logger.warning("lease of item %s was lost; it will be redelivered", self.item.id)
            except _OUTAGE as exc:  # the loop waits the outage out; the lease runs out
                self._stats.lost += 1
                logger.warning(
                    "item %s not settled (%s); it will be redelivered", self.item.id, exc
                )
        return True


class AsyncConsumer(_ConsumerState):
    """Pulls items from one queue through an ``AsyncClient``."""

    def __init__(self, client: AsyncClient, queue: str, *, lease_ms: int = 30_000, count: int = 1,
                 wait_ms: int = 20_000, backoff: Backoff | None = None,
                 max_extend_ms: int | None = None) -> None:  # fmt: skip
        self.client = client
        super().__init__(queue, lease_ms, count, wait_ms, backoff, max_extend_ms)

    async def jobs(self, *, stop: asyncio.Event | None = None,
                   max_items: int | None = None) -> AsyncIterator[AsyncJob]:  # fmt: skip
        """Leaving the loop early: ``await consumer.flush()`` releases the last jobs."""
        seen = 0
        pause = _OUTAGE_FIRST_S
        while (stop is None or not stop.is_set()) and (max_items is None or seen < max_items):
            want = self.count if max_items is None else min(self.count, max_items - seen)
            try:
                items = await self._take(want)
            except _OUTAGE as exc:
                wait = pause
                pause = _outage(self.queue, exc, wait)
                if stop is None:
                    await asyncio.sleep(wait)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), wait)
                continue
            pause = _OUTAGE_FIRST_S
            taken = asyncio.get_running_loop().time()
            batch = [AsyncJob(self.client, self.queue, item, self.lease_ms, self.backoff,
                              self.stats, self._settled, self.max_extend_ms)
                     for item in items]  # fmt: skip
            for job in batch:
                job.keep(since=taken)  # the later ones wait while the earlier ones run
            try:
                for n, job in enumerate(batch):
                    if n and self._settled:  # this job may outlast their leases
                        await self._release_waiting()
                    seen += 1
                    yield job
            finally:
                for job in batch:
                    if not job.ended:  # never run (the loop was left): not kept
                        await job.drop()
        await self._flush_quietly()

    async def _take(self, count: int) -> list[Item]:
        done = self._waiting()
        try:
            items = await self.client.dequeue(
                self.queue, count, self.lease_ms, self.wait_ms, release=done
            )
        except ClientError:
            self._settled[:0] = done  # they may not have been released: try again
            raise
        return self._taken(items)

    async def flush(self) -> None:
        """Release the finished jobs whose release is still waiting for a dequeue."""
        done = self._waiting()
        if done:
            self.stats.count_releases(await self.client.release_many(self.queue, done))

    async def _flush_quietly(self) -> None:
        try:
            await self.flush()
        except ClientError as exc:
            logger.warning("releasing finished jobs failed (they will be redelivered): %s", exc)

    async def _release_waiting(self) -> None:
        """``Consumer._release_waiting``'s twin."""
        done = self._waiting()
        try:
            self.stats.count_releases(await self.client.release_many(self.queue, done))
        except _OUTAGE as exc:
            self._settled[:0] = done
            logger.warning("releasing finished jobs failed (tried again later): %s", exc)
        except ClientError as exc:
            logger.warning("releasing finished jobs failed (they will be redelivered): %s", exc)

    async def run(self, handler: Callable[[Item], Awaitable[object]], *,
                  stop: asyncio.Event | None = None, max_items: int | None = None) -> ConsumerStats:  # fmt: skip
        try:
            async for job in self.jobs(stop=stop, max_items=max_items):
                async with job:
                    await handler(job.item)
        finally:
            await self._flush_quietly()
        return self.stats
