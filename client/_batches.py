"""Long lists sent as batches the server takes: the ``*_many`` calls of both clients.

The server refuses a request of more items than its batch limit (``DQ_MAX_BATCH``, 1,000
by default: 413 ``batch_too_large``) and a body over its size limit (413
``body_too_large``), in both cases before it has written anything of the request. So a
``*_many`` call sends its list as consecutive requests of at most ``max_batch`` items
(the server's default unless the client is told otherwise), and when one is refused as
too large it sends that part again in halves, down to one item. A count the server
refused is remembered for the client's later calls; a size is not (it depends on the
values). Results come back one per input item, in the input's order, as from a single
request.

When a request fails any other way, the error raised carries, in ``done``, the results
of the requests before it: those items were enqueued (released, ...) and stay so, and
nothing after the failed request was sent. Invariant: ``done`` is always a prefix of the
results the whole call would have returned, and the server never sees an item twice
from one call (a refused request wrote nothing, so sending it again in halves is safe).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from dq.client._calls import Call
from dq.client.errors import ClientError, TooLarge

__all__ = ["DEFAULT_MAX_BATCH", "Batches"]

#: The server's default batch limit (``DQ_MAX_BATCH``, docs/http.md "Limits").
DEFAULT_MAX_BATCH = 1000

#: The 413s the server answers before writing anything, which a smaller request avoids.
_TOO_LARGE = frozenset({"batch_too_large", "body_too_large"})

T = TypeVar("T")
R = TypeVar("R")


class Batches:
    """The batch size of one client, and its two loops (blocking and asyncio)."""

    def __init__(self, max_batch: int = DEFAULT_MAX_BATCH) -> None:
        if not isinstance(max_batch, int) or isinstance(max_batch, bool) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, not {max_batch!r}")
        #: items per request at most; lowered when the server refuses a count
        self.max_batch = max_batch

    def send(
        self,
        send: Callable[[Call[list[R]]], list[R]],
        make: Callable[[Sequence[T]], Call[list[R]]],
        items: Sequence[T],
    ) -> list[R]:
        """Every item, at most ``max_batch`` a request: ``send(make(part))`` (``send``: a
        transport's ``call``); the results in order."""
        done: list[R] = []
        size, sent = self.max_batch, 0
        while sent < len(items):
            part = items[sent : sent + size]
            try:
                results = send(make(part))
            except ClientError as exc:
                size = self._smaller(exc, len(part), done)
                continue
            done.extend(results)
            sent += len(part)
        return done

    async def send_async(
        self,
        send: Callable[[Call[list[R]]], Awaitable[list[R]]],
        make: Callable[[Sequence[T]], Call[list[R]]],
        items: Sequence[T],
    ) -> list[R]:
        """As ``send``, with an asynchronous ``send``."""
        done: list[R] = []
        size, sent = self.max_batch, 0
        while sent < len(items):
            part = items[sent : sent + size]
            try:
                results = await send(make(part))
            except ClientError as exc:
                size = self._smaller(exc, len(part), done)
                continue
            done.extend(results)
            sent += len(part)
        return done

    def _smaller(self, exc: ClientError, sent: int, done: list[R]) -> int:
        """The size to try next after ``exc`` refused ``sent`` items; else re-raise
        ``exc`` carrying ``done``, what the call did before it."""
        if isinstance(exc, TooLarge) and exc.code in _TOO_LARGE and sent > 1:
            size = sent // 2
            if exc.code == "batch_too_large":
                self.max_batch = min(self.max_batch, size)
            return size
        exc.done = list(done)
        raise exc
