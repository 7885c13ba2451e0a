"""Long-poll dequeue: one procedure for every transport, and the wake-ups it sleeps on.

A long-poll leases what is due; while nothing is, it sleeps until something may be:
items published (an enqueue, a requeue, a lease that ran out, a resumed queue), the
queue created (a worker may start before its producer), the queue's next deadline or
lease expiry by the clock, shutdown (``Waits.drain``), or the end of its wait. How a
waiter sleeps is its transport's business — the HTTP server awaits an ``asyncio.Event``
on its loop (``server/longpoll.py``), a ring session blocks its own thread
(``Waits.wait_blocking``) — but what it does between two sleeps is ``Poll.naps``,
written once, so that both transports answer the same at the same times
(``tests/server/test_long_poll_parity.py``).

``Waits`` holds the wake-ups of every waiter of one server (both transports share it):
while a queue has waiters, one ``engine.watch`` subscription (or, for a queue not
created yet, one ``engine.on_event`` subscription for its creation) wakes *one* waiter
per publication — the longest waiting that is not awake already —, and a waiter that
leased something, or was woken and leaves unserved, passes the turn on. So a
publication of one item costs two wake-ups whether 3 or 300 consumers wait, and a large
one reaches as many as it can serve.

Invariant: a waiter re-arms, then looks at the queue, then sleeps; a publication at
any point after it re-armed wakes it, so none is lost between "nothing due" and
"sleeping".
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from dq.storage.errors import QueueNotFound
from dq.storage.types import Delivery

if TYPE_CHECKING:
    from dq.storage.engine import Engine
    from dq.storage.events import Event

__all__ = ["Leased", "Poll", "Waiter", "Waits", "leased"]

#: Sleep at most this long without looking again: a safety net for a missed signal.
MAX_NAP_S = 1.0
#: Wake a hair after a due time, so that the engine's clock has passed it.
SLACK_S = 0.0005
#: The nap when the clock says due but the queue gave nothing (no busy loop).
RACE_NAP_S = 0.002


class Leased(list[Delivery]):
    """What a dequeue leased (it is the list of deliveries), and what the answer says
    beside them: whether the queue exists (a worker of a queue nobody created yet —
    or a misspelled one — hears so), and whether the server is shutting down (a
    transport that repeats short waits stops repeating them). Built as a list is
    (``Leased(items)``, no Python call); the two flags are set only when they differ
    from their defaults."""

    queue_exists = True
    draining = False


def leased(items: list[Delivery], queue_exists: bool, draining: bool) -> Leased:
    got = Leased(items)
    if not queue_exists:
        got.queue_exists = False
    if draining:
        got.draining = True
    return got


class Waiter:
    """One sleeping long-poll, as ``Waits`` sees it: how to wake it, and whether it
    has been woken since it last looked at the queue."""

    __slots__ = ("served", "wake", "woken")

    def __init__(self, wake: Callable[[], None]) -> None:
        #: wakes the sleeper; any thread, under the queue's lock: never blocks
        self.wake = wake
        self.woken = False
        #: leased something (the turn passes on when it leaves)
        self.served = False


class _Queue:
    """The waiters of one queue, in arrival order, and the subscription that wakes them."""

    __slots__ = ("exists", "unsubscribe", "waiters")

    def __init__(self) -> None:
        self.waiters: dict[Waiter, None] = {}
        self.unsubscribe: Callable[[], None] | None = None
        self.exists = True


class Waits:
    """Every long-poll waiter of one server, by queue; ``drain()`` ends every wait."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # Taken by publications (under a queue's lock) and queue creations (under the
        # engine's): nothing under it takes either lock.
        self._lock = threading.Lock()
        self._queues: dict[str, _Queue] = {}
        self._draining = False

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(len(q.waiters) for q in self._queues.values())

    def drain(self) -> None:
        """Shutdown: every wait returns what it has, now and from now on. Thread-safe
        (not from a signal handler: it takes a lock; defer it to a thread or a loop)."""
        with self._lock:
            self._draining = True
            for entry in self._queues.values():
                for waiter in entry.waiters:
                    waiter.woken = True
                    waiter.wake()

    def poll(self, queue: str, count: int, lease_ms: int | None, wait_ms: int) -> Poll:
        """One long-poll of ``queue``: lease up to ``count`` items, waiting up to
        ``wait_ms`` (the caller has clamped it to its server's maximum)."""
        return Poll(self, queue, count, lease_ms, wait_ms)

    def wait_blocking(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        woken: threading.Event,
        stop: threading.Event,
    ) -> Leased:
        """The long-poll of a thread that may block (a ring session): it sleeps on
        ``woken``, which its owner also sets when ``stop`` is set, so that a stop ends
        the wait at once; a stopped wait leases nothing more."""
        if wait_ms <= 0:  # no wait: the poll's one look (``Poll.lease``), without a poll
            try:
                items = self.engine.dequeue(queue, count, lease_ms)
            except QueueNotFound:
                return leased([], False, self._draining)
            return leased(items, True, self._draining)
        poll = self.poll(queue, count, lease_ms, wait_ms)
        if poll.lease() or wait_ms <= 0 or self._draining:
            return poll.result()
        with self.waiting_on(queue, woken.set) as waiter:
            for nap in poll.naps(waiter):
                woken.wait(nap)
                woken.clear()
                if stop.is_set():
                    break
        return poll.result()

    # ------------------------------------------------------------------ waiters

    @contextlib.contextmanager
    def waiting_on(self, queue: str, wake: Callable[[], None]) -> Iterator[Waiter]:
        """Register a waiter of ``queue`` woken by ``wake`` (thread-safe, non-blocking)."""
        waiter = Waiter(wake)
        with self._lock:
            entry = self._queues.get(queue)
            if entry is None:
                entry = self._queues[queue] = _Queue()
                try:
                    self._subscribe(queue, entry)
                except BaseException:
                    del self._queues[queue]
                    raise
            entry.waiters[waiter] = None
        try:
            yield waiter
        finally:
            with self._lock:
                entry.waiters.pop(waiter, None)
                if not entry.waiters:
                    del self._queues[queue]
                    if entry.unsubscribe is not None:
                        entry.unsubscribe()
                elif waiter.served or waiter.woken:
                    # Leased something (there may be more), or woken and leaving
                    # unserved: the next waiter gets its turn.
                    self._wake_one(entry)

    def missing(self, queue: str) -> None:
        """A waiter found ``queue`` gone (deleted while it waited): watch for its
        creation again, so that a queue made anew wakes its waiters."""
        with self._lock:
            entry = self._queues.get(queue)
            if entry is not None and entry.exists:
                self._subscribe(queue, entry)

    def _wake_one(self, entry: _Queue) -> None:
        for waiter in entry.waiters:
            if not waiter.woken:
                waiter.woken = True
                waiter.wake()
                return

    def _subscribe(self, queue: str, entry: _Queue) -> None:
        """Under ``_lock``: watch the queue's publications, or its creation."""
        if entry.unsubscribe is not None:
            entry.unsubscribe()
            entry.unsubscribe = None
        engine = self.engine
        try:
            entry.unsubscribe = engine.watch(queue, lambda: self._published(queue))
            entry.exists = True
            return
        except QueueNotFound:
            pass

        def on_event(event: Event) -> None:  # any thread, on every engine event
            if event.kind == "queue_created" and event.queue == queue:
                self._created(queue)

        entry.exists = False
        entry.unsubscribe = engine.on_event(on_event)
        if engine.has_queue(queue):  # created between the failed watch and now
            self._switch_to_watch(queue, entry)

    def _published(self, queue: str) -> None:
        """Items were published: wake the longest-waiting waiter not awake already."""
        with self._lock:
            entry = self._queues.get(queue)
            if entry is not None:
                self._wake_one(entry)

    def _created(self, queue: str) -> None:
        with self._lock:
            entry = self._queues.get(queue)
            if entry is not None and not entry.exists:
                self._switch_to_watch(queue, entry)

    def _switch_to_watch(self, queue: str, entry: _Queue) -> None:
        """Under ``_lock``: the queue now exists: watch it, and let every waiter look."""
        self._subscribe(queue, entry)
        for waiter in entry.waiters:
            waiter.woken = True
            waiter.wake()


class Poll:
    """One long-poll's state: what it asks, until when it waits, what it got."""

    __slots__ = ("_exists", "_items", "_waits", "count", "give_up", "lease_ms", "queue")

    def __init__(
        self, waits: Waits, queue: str, count: int, lease_ms: int | None, wait_ms: int
    ) -> None:
        self._waits = waits
        self.queue = queue
        self.count = count
        self.lease_ms = lease_ms
        self.give_up = time.monotonic() + max(wait_ms, 0) / 1000.0
        self._exists = True
        self._items: list[Delivery] = []

    def lease(self) -> list[Delivery]:
        """Lease what is due now; a queue that does not exist (yet) has nothing due."""
        try:
            self._items = self._waits.engine.dequeue(self.queue, self.count, self.lease_ms)
        except QueueNotFound:
            self._items = []
            self._exists = False
        else:
            self._exists = True
        return self._items

    def result(self) -> Leased:
        return leased(self._items, self._exists, self._waits._draining)

    def abandon(self) -> Leased:
        """The waiter stops without looking again (its client went away)."""
        return leased([], self._exists, self._waits._draining)

    def naps(self, waiter: Waiter) -> Iterator[float]:
        """Look at the queue again after each sleep; yields how long to sleep next (s).

        Ends when something was leased, the wait is over, or the server drains; the
        caller sleeps until woken or the nap is over, and may stop early (``break``)."""
        waits, engine, queue = self._waits, self._waits.engine, self.queue
        while True:
            waiter.woken = False
            if self.lease():
                waiter.served = True
                return
            if not self._exists:
                waits.missing(queue)
            remaining = self.give_up - time.monotonic()
            if remaining <= 0 or waits.draining:
                return
            nap = min(remaining, MAX_NAP_S)
            wakeup = self._next_wakeup()
            if wakeup is not None:
                ahead = (wakeup - engine.now()) / 1000.0
                if ahead <= 0:
                    # Due by the clock yet nothing came back: a lease ran out and the
                    # periodic expiry has not run yet, or another consumer won the
                    # race. Expire now and look again; otherwise nap briefly.
                    if self._expire():
                        continue
                    ahead = RACE_NAP_S
                nap = min(nap, ahead + SLACK_S)
            yield nap

    def _next_wakeup(self) -> int | None:
        try:
            return self._waits.engine.next_wakeup(self.queue)
        except QueueNotFound:
            return None

    def _expire(self) -> int:
        try:
            return self._waits.engine.expire_leases(self.queue)
        except QueueNotFound:
            return 0
