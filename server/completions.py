"""Durable results from the engine's syncer thread onto the event loop, one wake-up a round.

The engine resolves a ``concurrent.futures.Future`` per request from its syncer thread
once a group commit is on disk. Handing each one to the loop with its own
``call_soon_threadsafe`` costs a write to the loop's self-pipe and a wake-up per
request; a group commit of 30 requests would wake the loop 30 times. ``Completions``
queues the resolved futures and schedules one drain for all that arrive before the
loop gets to them.

When the loop commits its own writes (``Syncer.commit_inline``, set up in
``server/lifespan.py``), the futures are resolved on the loop itself, inside that
commit: their callbacks then run at once, with no round trip through the loop's queue.

Invariant: a callback runs on the loop exactly once per future, after the future is
done; the engine's future is never cancelled from here (a cancelled one would make
the syncer's ``set_result`` fail for the rest of its batch).
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["Completions"]

T = TypeVar("T")
Done = Callable[[Future[Any]], None]


class Completions:
    """Runs ``callback(future)`` on ``loop`` once ``future`` is done (from any thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ready: deque[tuple[Future[Any], Done]] = deque()
        self._scheduled = False
        #: the loop's thread: set by ``bind_thread`` on it
        self._loop_thread = -1

    def bind_thread(self) -> None:
        """Called on the loop's thread: futures resolved there run their callbacks at once."""
        self._loop_thread = threading.get_ident()

    def when_done(self, fut: Future[T], callback: Callable[[Future[T]], None]) -> None:
        """``callback(fut)`` on the loop; at once if ``fut`` is already done."""
        if fut.done():
            callback(fut)
            return
        ready = self._ready

        def arrived(f: Future[Any]) -> None:  # the thread that resolved it
            if threading.get_ident() == self._loop_thread:  # ``_run``, without its call
                try:
                    callback(f)
                except Exception as exc:
                    self._loop.call_exception_handler(
                        {"message": "durable completion callback failed", "exception": exc}
                    )
                return
            ready.append((f, callback))
            if not self._scheduled:
                self._scheduled = True
                self._loop.call_soon_threadsafe(self._drain)

        fut.add_done_callback(arrived)

    def wait(self, fut: Future[T]) -> asyncio.Future[T]:
        """An asyncio future that follows ``fut`` (cancelling it leaves ``fut`` alone)."""
        waiter: asyncio.Future[T] = self._loop.create_future()

        def transfer(f: Future[T]) -> None:
            if waiter.cancelled():
                return
            exc = f.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(f.result())

        self.when_done(fut, transfer)
        return waiter

    def _drain(self) -> None:
        # Reset first: a future resolved while we drain schedules a new round rather
        # than being left behind.
        self._scheduled = False
        ready = self._ready
        while ready:
            fut, callback = ready.popleft()
            self._run(fut, callback)

    def _run(self, fut: Future[Any], callback: Done) -> None:
        try:
            callback(fut)
        except Exception as exc:  # one broken callback must not strand the rest
            self._loop.call_exception_handler(
                {"message": "durable completion callback failed", "exception": exc}
            )
