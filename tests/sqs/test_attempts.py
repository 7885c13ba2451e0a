"""The memory of FIFO receives by ``ReceiveRequestAttemptId`` (server/sqs/attempts.py):
its window, its bound, what spends an attempt id, one receive at a time per id. The
retries themselves, through boto3 against a live server, are in test_fifo.py."""

from __future__ import annotations

import asyncio

import pytest

from dq.server.sqs.attempts import ChangedSince, ReceiveAttempts
from dq.storage.types import Delivery, ItemStats


def _delivery(item_id: int) -> Delivery:
    stats = ItemStats(enqueue_time=0, requeue_time=0, dequeue_count=1)
    return Delivery(item_id, f"e.{item_id:x}.1", b"v", 0, stats, 10_000, group=f"g{item_id}")


def test_an_attempt_is_found_within_its_window_only() -> None:
    attempts = ReceiveAttempts(window_ms=1_000)
    attempts.remember("q.fifo", "a", 5_000, 2_000, [_delivery(1), _delivery(2)])
    found = attempts.find("q.fifo", "a", 5_999)
    assert found is not None and [d.id for d in found.deliveries] == [1, 2]
    assert found.lease_ms == 2_000 and found.at == 5_000
    assert attempts.find("other.fifo", "a", 5_999) is None  # per queue
    assert attempts.find("q.fifo", "a", 6_000) is None
    assert len(attempts) == 0  # and forgotten


def test_a_retry_does_not_lengthen_the_window() -> None:
    attempts = ReceiveAttempts(window_ms=1_000)
    attempts.remember("q.fifo", "a", 0, None, [_delivery(1), _delivery(2)])
    attempts.keep("q.fifo", "a", [_delivery(2)])  # answered again at 900: one left
    found = attempts.find("q.fifo", "a", 900)
    assert found is not None and [d.id for d in found.deliveries] == [2]
    assert attempts.find("q.fifo", "a", 1_000) is None


def test_deleting_or_changing_a_message_spends_the_attempt_id() -> None:
    attempts = ReceiveAttempts()
    attempts.remember("q.fifo", "a", 0, None, [_delivery(1), _delivery(2)])
    attempts.remember("q.fifo", "b", 0, None, [_delivery(3)])
    attempts.changed("q.fifo", ["e.9.1"])  # a receipt no attempt gave
    assert attempts.find("q.fifo", "a", 1) is not None
    attempts.changed("other.fifo", ["e.2.1"])  # another queue's
    assert attempts.find("q.fifo", "a", 1) is not None
    attempts.changed("q.fifo", ["e.2.1"])
    with pytest.raises(ChangedSince):
        attempts.find("q.fifo", "a", 1)
    assert attempts.find("q.fifo", "b", 1) is not None
    # a receipt the retry no longer answered (visible again) spends nothing
    attempts.keep("q.fifo", "b", [])
    attempts.changed("q.fifo", ["e.3.1"])
    assert attempts.find("q.fifo", "b", 1) is not None


def test_remembering_again_replaces_and_the_oldest_go_past_the_bound() -> None:
    attempts = ReceiveAttempts(limit=2)
    attempts.remember("q.fifo", "a", 0, None, [_delivery(1)])
    attempts.changed("q.fifo", ["e.1.1"])
    attempts.remember("q.fifo", "a", 1, None, [_delivery(4)])  # received anew
    found = attempts.find("q.fifo", "a", 2)
    assert found is not None and not found.changed
    attempts.remember("q.fifo", "b", 2, None, [_delivery(2)])
    attempts.remember("q.fifo", "c", 3, None, [_delivery(3)])
    assert len(attempts) == 2
    assert attempts.find("q.fifo", "a", 4) is None
    attempts.changed("q.fifo", ["e.4.1"])  # its receipts went with it
    assert attempts.find("q.fifo", "b", 4) is not None
    attempts.forget_queue("q.fifo")
    assert len(attempts) == 0


def test_receives_of_one_attempt_id_run_one_at_a_time() -> None:
    attempts = ReceiveAttempts()
    order: list[str] = []

    async def receive(attempt: str, name: str, hold: float) -> None:
        async with attempts.serial("q.fifo", attempt):
            order.append(f"{name} in")
            await asyncio.sleep(hold)
            order.append(f"{name} out")

    async def main() -> None:
        await asyncio.gather(
            receive("a", "first", 0.05), receive("a", "retry", 0), receive("b", "other", 0)
        )

    asyncio.run(main())
    assert order.index("retry in") > order.index("first out")
    assert order.index("other out") < order.index("first out")  # another id does not wait
    assert attempts._running == {}
