"""Long-poll dequeue on the event loop: the asyncio adapter of ``storage/waits.py``.

What a long-poll does between two sleeps — lease, watch for the queue's creation,
expire a lease that ran out, compute the next nap — is ``Poll.naps``, shared with the
ring sessions (which block their own threads instead). Here a waiter is an
``asyncio.Event`` on the loop: no thread per waiting request. A publication from
another thread reaches it with one ``call_soon_threadsafe``; one from the loop itself
(a write the loop committed) sets it directly.

A long-poll whose client disconnects (``gone``) ends at once without leasing anything,
so a dead long-poll never takes items nobody will receive.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dq.storage.waits import Leased, Waits

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["LongPoll"]


class LongPoll:
    """Waits, on ``loop``, for a queue to have due items; ``drain()`` ends every wait."""

    def __init__(
        self, engine: Engine, loop: asyncio.AbstractEventLoop, waits: Waits | None = None
    ) -> None:
        self.waits = waits if waits is not None else Waits(engine)
        self._loop = loop
        self._loop_thread = -1

    @property
    def waiting(self) -> int:
        return self.waits.waiting

    def drain(self) -> None:
        """Stop long-polls (shutdown): current waits return what they have. Thread- and
        signal-safe: the drain itself runs on the loop."""
        self._loop.call_soon_threadsafe(self.waits.drain)

    async def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        gone: Callable[[], Awaitable[object]] | None = None,
    ) -> Leased:
        """``engine.dequeue`` that waits up to ``wait_ms`` for something to be due.

        ``gone`` completes when the client has disconnected: the wait then ends with
        nothing leased."""
        waits = self.waits
        poll = waits.poll(queue, count, lease_ms, wait_ms)
        if poll.lease() or wait_ms <= 0 or waits.draining:
            return poll.result()
        loop = self._loop
        if self._loop_thread == -1:
            self._loop_thread = threading.get_ident()  # a long-poll runs on the loop
        loop_thread = self._loop_thread
        event = asyncio.Event()
        set_event = event.set

        def wake() -> None:  # any thread; the loop's own when it committed the write
            if threading.get_ident() == loop_thread:
                set_event()
            else:
                loop.call_soon_threadsafe(set_event)

        watcher = None if gone is None else asyncio.ensure_future(gone())
        if watcher is not None:
            watcher.add_done_callback(lambda _: set_event())
        try:
            with waits.waiting_on(queue, wake) as waiter:
                for nap in poll.naps(waiter):
                    timer = loop.call_later(nap, set_event)
                    try:
                        await event.wait()
                    finally:
                        timer.cancel()
                    event.clear()
                    if watcher is not None and watcher.done():
                        return poll.abandon()
        finally:
            if watcher is not None:
                watcher.cancel()
        return poll.result()
