"""Operating a queue through ``Client`` and ``AsyncClient`` against a live server, and
the retry rule for keyed enqueues (scripted server)."""

from __future__ import annotations

import asyncio
import time

import pytest

from dq.client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    ItemNotFound,
    NewItem,
    QueueConfig,
    StaleReceipt,
    TransportError,
)
from tests.client.scripted import DROP, Answer, scripted
from tests.server.live import LiveServer

pytestmark = pytest.mark.integration  # a live dq serve


def test_pause_browse_peek_delete_purge(dq: Client, queue: str) -> None:
    ids = [e.id for e in dq.enqueue_many(queue, [b"a", b"b", NewItem(b"c", delay_ms=60_000)])]
    assert dq.pause(queue).stats.paused
    assert dq.dequeue(queue, count=5) == []
    assert not dq.resume(queue).stats.paused
    (leased,) = dq.dequeue(queue, lease_ms=60_000)
    page = dq.browse(queue, limit=2, values=True)
    assert [(i.id, i.state, i.value) for i in page.items] == [
        (ids[0], "leased", b"a"),
        (ids[1], "due", b"b"),
    ]
    rest = dq.browse(queue, after=page.next)
    assert [i.id for i in rest.items] == [ids[2]] and rest.next is None
    assert dq.peek(queue, ids[2]).state == "delayed"
    assert dq.queue(queue).stats.oldest_lease_age_ms is not None
    dq.delete_item(queue, ids[1])
    with pytest.raises(ItemNotFound):
        dq.delete_item(queue, ids[1])
    assert dq.peek(queue, ids[1]).state == "gone"
    assert dq.purge(queue) == 2
    with pytest.raises(StaleReceipt):
        dq.release(queue, leased.id, leased.receipt)


def test_keyed_enqueue_and_redrive(dq: Client, queue: str) -> None:
    first = dq.enqueue(queue, b"once", key="order-1")
    assert dq.enqueue(queue, b"twice", key="order-1") == first
    done = dq.enqueue_many(queue, [NewItem(b"x", key="order-1"), NewItem(b"y", key="o2")])
    assert [e.duplicate for e in done] == [True, False]
    with pytest.raises(BadRequest) as err:
        dq.enqueue(queue, b"z", key="k" * 200)
    assert err.value.code == "invalid_key"
    dq.put_queue(queue + "-src", QueueConfig(max_deliveries=1, default_lease_ms=100))
    dq.enqueue(queue + "-src", b"poison")
    dq.dequeue(queue + "-src")
    time.sleep(0.3)
    assert dq.dequeue(queue + "-src") == []
    dlq = dq.queue(queue + "-src").config.dead_letter_queue
    assert dlq == queue + "-src.dlq"
    give_up = time.monotonic() + 5
    while not dq.browse(dlq).items:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    assert dq.browse(dlq).items[0].dead_lettered_from == queue + "-src"
    r = dq.redrive(dlq)
    assert (r.moved, r.to, r.failed) == (1, [queue + "-src"], [])
    with pytest.raises(BadRequest) as err:
        dq.redrive(queue)
    assert err.value.code == "not_a_dead_letter_queue"
    assert dq.redrive(queue, to=queue + "-elsewhere", limit=1).moved == 1


def test_a_queue_name_a_path_cannot_carry_is_refused_before_anything_is_sent(
    dq: Client, queue: str
) -> None:
    ids = [e.id for e in dq.enqueue_many(queue, [b"a", b"b"])]
    # the server decodes %2F before routing: "<queue>/items" would be the queue's items
    for call in (
        lambda: dq.delete_queue(f"{queue}/items"),
        lambda: dq.delete_queue(f"{queue}/items/{ids[0]}"),
        lambda: dq.queue(f"{queue}/items"),
        lambda: dq.delete_queue(""),
        lambda: dq.queue(""),
    ):
        with pytest.raises(BadRequest) as err:
            call()
        assert err.value.code == "invalid_queue_name"
    assert [i.id for i in dq.browse(queue).items] == ids  # nothing purged or deleted


def test_a_dead_letter_circle_is_refused(dq: Client, queue: str) -> None:
    """a's dead letters to b and b's to a would move an item between them at every
    dequeue of either, never delivering it."""
    a, b = queue + "-a", queue + "-b"
    dq.put_queue(a, QueueConfig(max_deliveries=1, dead_letter_queue=b))
    dq.put_queue(b, QueueConfig(dead_letter_queue=a))  # no max_deliveries: b moves nothing
    with pytest.raises(Conflict) as err:
        dq.put_queue(b, QueueConfig(max_deliveries=1, dead_letter_queue=a))
    assert err.value.code == "config_conflict" and f"{b} -> {a} -> {b}" in err.value.message
    dq.put_queue(queue, QueueConfig(max_deliveries=2))  # dead letters to <queue>.dlq
    with pytest.raises(Conflict):
        dq.put_queue(queue + ".dlq", QueueConfig(max_deliveries=1, dead_letter_queue=queue))
    assert dq.queue(b).config.max_deliveries is None  # the refused config was not kept


def test_async_client_operates_a_queue(server: LiveServer, queue: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url) as dq:
            a = await dq.enqueue(queue, b"a", key="k")
            assert await dq.enqueue(queue, b"a", key="k") == a
            assert (await dq.pause(queue)).stats.paused
            assert (await dq.peek(queue, a)).value == b"a"
            page = await dq.browse(queue, state="due")
            assert [i.id for i in page.items] == [a]
            assert not (await dq.resume(queue)).stats.paused
            await dq.delete_item(queue, a)
            assert await dq.purge(queue) == 0
            with pytest.raises(ItemNotFound):
                await dq.peek(queue, 10_000)

    asyncio.run(run())


def test_an_enqueue_whose_items_all_have_keys_is_retried_after_a_lost_answer() -> None:
    ok = Answer(200, {"items": [{"id": 7, "deadline": 1, "duplicate": True}]})
    with scripted(DROP, ok) as server, Client(server.url) as dq:
        assert dq.enqueue("q", b"x", key="k") == 7
    seen = server.seen
    assert len(seen) == 2 and seen[0][2] == seen[1][2]
    with (
        scripted(DROP, ok) as server,
        Client(server.url) as dq,
        pytest.raises(TransportError),  # one item without a key: not safe to resend
    ):
        dq.enqueue_many("q", [NewItem(b"x", key="k"), NewItem(b"y")])
    assert len(server.seen) == 1


def test_consumer_stops_extending_a_job_after_max_extend_ms(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"slow")
    consumer = dq.consumer(queue, lease_ms=600, wait_ms=0, max_extend_ms=300)
    jobs = consumer.jobs(max_items=1)
    job = next(jobs)
    with job:
        time.sleep(1.6)  # a hung handler: extended until 300 ms, then left to run out
        again = dq.dequeue(queue, wait_ms=1000)
        assert [i.value for i in again] == [b"slow"]  # delivered again meanwhile
    assert job.lost or dq.queue(queue).stats.lease_expired >= 1
    jobs.close()
    # without a cap the same handler keeps its item
    dq.enqueue(queue + "-b", b"kept")
    consumer = dq.consumer(queue + "-b", lease_ms=1500, wait_ms=0)  # extended every 0.5 s
    jobs = consumer.jobs(max_items=1)
    with next(jobs):
        time.sleep(2.5)  # outlives the first lease: only the extensions keep the item
        assert dq.dequeue(queue + "-b") == []
    jobs.close()
