"""Long-poll dequeue without a thread per waiting request.

Owns the per-queue wake-up signals: while at least one request waits on a queue, one
``engine.watch`` subscription forwards "items were published" from whatever thread
publishes them onto the event loop (``call_soon_threadsafe``). A publication wakes
*one* waiter (the longest waiting); a waiter that was woken and leased something
passes the wake-up on to the next, so a publication of one item costs two wake-ups
whether 3 or 300 consumers wait, and a large one reaches as many as it can serve.
Between publications a waiter sleeps until the engine's ``next_wakeup`` (the next
deadline or lease expiry), so an item that becomes due by the clock wakes it too.

A queue that does not exist yet has nothing due: its waiters wait, subscribed to the
engine's ``queue_created`` event, and are woken when it is created (then watch it like
any other). Invariant: a waiter re-checks the queue *after* registering its event, so
a publication between "nothing due" and "start waiting" is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING

from dq.storage.errors import QueueNotFound

if TYPE_CHECKING:
    from dq.storage import Engine
    from dq.storage.events import Event
    from dq.storage.types import Delivery

__all__ = ["LongPoll"]

logger = logging.getLogger(__name__)

#: Sleep at most this long without re-checking, as a safety net for missed signals.
_MAX_NAP_S = 1.0
#: Timer slack: wake a hair after the due time so the engine clock has passed it.
_SLACK_S = 0.0005
#: Nap when the clock says due but the queue gave nothing (avoids a busy loop).
_RACE_NAP_S = 0.002


class _QueueSignal:
    __slots__ = ("events", "exists", "unsubscribe")

    def __init__(self) -> None:
        #: Waiters in arrival order (a dict: ordered, O(1) removal).
        self.events: dict[asyncio.Event, None] = {}
        self.unsubscribe: Callable[[], None] | None = None
        self.exists = True


class LongPoll:
    """Waits for a queue to have due items; ``drain()`` ends every wait at once."""

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = loop
        self._signals: dict[str, _QueueSignal] = {}
        self._draining = False

    @property
    def waiting(self) -> int:
        return sum(len(s.events) for s in self._signals.values())

    def drain(self) -> None:
        """Stop long-polls (shutdown): current waits return what they have. Thread-safe."""
        self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._draining = True
        for signal in self._signals.values():
            for event in signal.events:
                event.set()

    def _notify(self, queue: str) -> None:
        """Wake the longest-waiting request that is not awake already."""
        signal = self._signals.get(queue)
        if signal is not None:
            for event in signal.events:
                if not event.is_set():
                    event.set()
                    return

    def _pass_on(self, queue: str, event: asyncio.Event) -> None:
        signal = self._signals.get(queue)
        if signal is not None:
            signal.events.pop(event, None)
            self._notify(queue)

    def _created(self, queue: str) -> None:
        """The queue now exists: watch it and let every waiter look."""
        signal = self._signals.get(queue)
        if signal is None or signal.exists:
            return
        self._subscribe(queue, signal)
        for event in signal.events:
            event.set()

    def _subscribe(self, queue: str, signal: _QueueSignal) -> None:
        if signal.unsubscribe is not None:
            signal.unsubscribe()
            signal.unsubscribe = None
        loop, notify = self._loop, self._notify
        loop_thread = threading.get_ident()  # subscribing happens on the loop

        def on_publish() -> None:  # any thread; the loop's own when it committed the write
            if threading.get_ident() == loop_thread:
                loop.call_soon(notify, queue)  # no wake-up write to the loop's self-pipe
            else:
                loop.call_soon_threadsafe(notify, queue)

        try:
            signal.unsubscribe = self._engine.watch(queue, on_publish)
            signal.exists = True
            return
        except QueueNotFound:
            pass
        created = self._created

        def on_event(event: Event) -> None:  # any thread, on every engine event
            if event.kind == "queue_created" and event.queue == queue:
                loop.call_soon_threadsafe(created, queue)

        signal.exists = False
        signal.unsubscribe = self._engine.on_event(on_event)
        # Created between the failed watch and the subscription: look again.
        if queue in self._engine.list_queues():
            loop.call_soon(created, queue)

    @contextlib.contextmanager
    def _registered(self, queue: str) -> Iterator[asyncio.Event]:
        signal = self._signals.get(queue)
        if signal is None:
            signal = self._signals[queue] = _QueueSignal()
            try:
                self._subscribe(queue, signal)
            except BaseException:
                del self._signals[queue]
                raise
        event = asyncio.Event()
        signal.events[event] = None
        try:
            yield event
        finally:
            signal.events.pop(event, None)
            if not signal.events:
                del self._signals[queue]
                if signal.unsubscribe is not None:
                    signal.unsubscribe()

    def _lease(self, queue: str, count: int, lease_ms: int | None) -> list[Delivery]:
        try:
            return self._engine.dequeue(queue, count, lease_ms)
        except QueueNotFound:
            return []

    def _next_wakeup(self, queue: str) -> int | None:
        try:
            return self._engine.next_wakeup(queue)
        except QueueNotFound:
            return None

    async def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> list[Delivery]:
        """``engine.dequeue`` that waits up to ``wait_ms`` for something to be due.

        ``gone`` completes when the client has disconnected: the wait then ends with
        nothing leased, so a dead long-poll never takes items nobody will receive.
        """
        engine = self._engine
        items = self._lease(queue, count, lease_ms)
        if items or wait_ms <= 0 or self._draining:
            return items
        loop = self._loop
        give_up = loop.time() + wait_ms / 1000.0
        with self._registered(queue) as event:
            watcher = None if gone is None else asyncio.ensure_future(gone())
            if watcher is not None:
                watcher.add_done_callback(lambda _: event.set())
            items = []
            try:
                while True:
                    event.clear()
                    if watcher is not None and watcher.done():
                        return []
                    items = self._lease(queue, count, lease_ms)
                    remaining = give_up - loop.time()
                    if items or remaining <= 0 or self._draining:
                        return items
                    nap = min(remaining, _MAX_NAP_S)
                    wakeup = self._next_wakeup(queue)
                    if wakeup is not None:
                        ahead = (wakeup - engine.now()) / 1000.0
                        if ahead <= 0:
                            # Due by the clock yet nothing came back: a lease ran out and
                            # the periodic expiry has not run yet, or another consumer won
                            # the race. Expire now; otherwise nap briefly.
                            if engine.expire_leases(queue):
                                continue
                            ahead = _RACE_NAP_S
                        nap = min(nap, ahead + _SLACK_S)
                    timer = loop.call_later(nap, event.set)
                    try:
                        await event.wait()
                    finally:
                        timer.cancel()
            finally:
                if watcher is not None:
                    watcher.cancel()
                if items or event.is_set():
                    # Leased something (there may be more), or woken and leaving
                    # unserved: the next waiter gets its turn.
                    self._pass_on(queue, event)
