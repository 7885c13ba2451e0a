"""The consumer helper with the queue's retry policy, against a live ``dq serve``: a
worker whose handler raises a few times and then succeeds, as a user writes one."""

from __future__ import annotations

import asyncio
import time

import pytest

from dq.client import AsyncClient, Client, Item, QueueConfig, RetryPolicy
from dq.client.jobs import error_text
from tests.server.live import LiveServer

pytestmark = pytest.mark.integration  # a live server


class FlakyCharge:
    """Raises ``fails`` times, then succeeds; notes when each attempt ran and what the
    item said about the attempt before."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.attempts: list[tuple[int, int, str | None]] = []  # (ms, dequeue_count, last_error)

    def __call__(self, item: Item) -> None:
        self.attempts.append((int(time.time() * 1000), item.stats.dequeue_count, item.last_error))
        if len(self.attempts) <= self.fails:
            raise ConnectionError(f"card network down (attempt {len(self.attempts)})")


def test_a_handler_that_raises_twice_then_succeeds(dq: Client, queue: str) -> None:
    dq.put_queue(queue, QueueConfig(retry=RetryPolicy(initial_ms=300, multiplier=2, max_ms=5000)))
    item_id = dq.enqueue(queue, b"charge order 7")
    handler = FlakyCharge(fails=2)
    stats = dq.consumer(queue, wait_ms=2000).run(handler, max_items=3)
    assert (stats.failed, stats.released, stats.requeued, stats.lost) == (2, 1, 0, 0)
    (t1, n1, e1), (t2, n2, e2), (t3, n3, e3) = handler.attempts
    assert (n1, n2, n3) == (1, 2, 3)
    assert e1 is None
    assert e2 == "ConnectionError: card network down (attempt 1)"
    assert e3 == "ConnectionError: card network down (attempt 2)"
    # the server's policy spaced them: 300 ms, then 600 ms (and never much more)
    assert 300 <= t2 - t1 < 1500
    assert 600 <= t3 - t2 < 1800
    assert dq.peek(queue, item_id).state == "gone"  # released on the third attempt


def test_the_reasons_are_kept_with_the_item(dq: Client, queue: str) -> None:
    dq.put_queue(queue, QueueConfig(retry=RetryPolicy(delays_ms=(60_000,))))
    item_id = dq.enqueue(queue, b"x")
    stats = dq.consumer(queue, wait_ms=1000).run(FlakyCharge(fails=1), max_items=1)
    assert stats.failed == 1
    peeked = dq.peek(queue, item_id)
    assert peeked.state == "delayed"  # waiting out its minute
    assert peeked.last_error == "ConnectionError: card network down (attempt 1)"
    assert [(r.error, r.delivery) for r in peeked.errors] == [
        ("ConnectionError: card network down (attempt 1)", 1)
    ]
    assert dq.queue(queue).config.retry == RetryPolicy(delays_ms=(60_000,))


def test_an_async_handler_that_raises_then_succeeds(server: LiveServer, queue: str) -> None:
    async def run() -> list[str | None]:
        async with AsyncClient(server.url) as dq:
            await dq.put_queue(queue, QueueConfig(retry=RetryPolicy(delays_ms=(200,))))
            await dq.enqueue(queue, b"y")
            seen: list[str | None] = []

            async def handler(item: Item) -> None:
                seen.append(item.last_error)
                if len(seen) == 1:
                    raise KeyError("account")

            stats = await dq.consumer(queue, wait_ms=2000).run(handler, max_items=2)
            assert (stats.failed, stats.released) == (1, 1)
            return seen

    assert asyncio.run(run()) == [None, "KeyError: 'account'"]


def test_an_error_text_is_cut_to_what_the_server_takes() -> None:
    assert error_text(ValueError("bad")) == "ValueError: bad"
    assert error_text(TimeoutError()) == "TimeoutError"
    long = error_text(RuntimeError("é" * 5000))
    assert len(long.encode()) <= 4096 and long.startswith("RuntimeError: é")
