"""``Client("shm:///data-dir")`` against a real ``dq serve`` with shared memory on: the same
API and answers as over HTTP, with values too big for a slot sent over HTTP transparently."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.client import AsyncClient, Client, QueueConfig, QueueNotFound, StaleReceipt
from dq.client.errors import TransportError
from dq.client.shm_transport import ShmTransport
from dq.shm.attach import SHM_DIR, shm_prefix
from tests.server.live import LiveServer, live_server

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "50"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq") / "data"
    with live_server(data, env=ENV) as s:
        yield s
    assert list(SHM_DIR.glob(f"{shm_prefix(data)}*")) == []  # stopping unlinked every ring


@pytest.fixture
def shm_url(server: LiveServer) -> str:
    return f"shm://{server.data_dir}"


def test_the_ring_client_does_what_the_http_client_does(server: LiveServer, shm_url: str) -> None:
    with Client(shm_url) as dq, Client(server.url) as http:
        assert isinstance(dq.transport, ShmTransport)
        assert dq.transport.http_url == server.url
        first = dq.enqueue("same", b"one")
        ids = [e.id for e in dq.enqueue_many("same", [b"two", "three"])]
        assert ids == [first + 1, first + 2]
        items = dq.dequeue("same", count=5, lease_ms=60_000)
        assert [i.value for i in items] == [b"one", b"two", b"three"]
        # a receipt the ring handed out works over HTTP, and the other way round
        http.release("same", items[0].id, items[0].receipt)
        with pytest.raises(StaleReceipt):
            dq.release("same", items[0].id, items[0].receipt)
        outcome = dq.extend("same", items[1].id, items[1].receipt, 120_000)
        assert outcome.ok and outcome.receipt and outcome.lease_expires
        new_deadline = dq.requeue("same", items[2].id, items[2].receipt, delay_ms=3_600_000)
        assert new_deadline > items[2].deadline
        outcomes = dq.release_many("same", [items[0], items[1]])
        assert [(o.ok, o.error) for o in outcomes] == [(False, "stale_receipt"), (True, None)]
        via_ring, via_http = dq.queue("same"), http.queue("same")
        assert via_ring.config == via_http.config
        assert (via_ring.stats.pending, via_ring.stats.delayed) == (1, 1)
        assert (via_http.stats.pending, via_http.stats.leased) == (1, 0)
        with pytest.raises(QueueNotFound):
            dq.queue("never-made")
        assert dq.health()["status"] == "ok"


def test_values_that_do_not_fit_a_slot_go_over_http(shm_url: str) -> None:
    big = bytes(range(256)) * 16  # 4 KiB
    with Client(shm_url) as dq:
        item_id = dq.enqueue("big", big)
        fits = dq.enqueue("big", b"x" * 1024)
        items = dq.dequeue("big", count=2)  # comes back through the ring, in chunks
        assert [(i.id, i.value) for i in items] == [(item_id, big), (fits, b"x" * 1024)]
        dq.release_many("big", items)


def test_queue_administration_goes_over_http(shm_url: str) -> None:
    with Client(shm_url) as dq:
        info = dq.put_queue("admin", QueueConfig(default_lease_ms=5_000, max_deliveries=3))
        assert info.config.max_deliveries == 3
        assert "admin" in [q.name for q in dq.queues()]
        assert dq.queue("admin").config.default_lease_ms == 5_000
        dq.delete_queue("admin")
        with pytest.raises(QueueNotFound):
            dq.queue("admin")


def test_long_poll_and_the_async_client(shm_url: str) -> None:
    async def run() -> list[bytes]:
        async with AsyncClient(shm_url) as dq:
            await dq.put_queue("async")
            waiter = asyncio.create_task(dq.dequeue("async", count=1, wait_ms=5_000))
            await asyncio.sleep(0.1)
            async with AsyncClient(shm_url) as producer:
                await producer.enqueue("async", b"woke")
            items = await asyncio.wait_for(waiter, 10)
            await dq.release_many("async", items)
            return [i.value for i in items]

    assert asyncio.run(run()) == [b"woke"]


def test_no_server_is_a_transport_error(tmp_path: Path) -> None:
    with pytest.raises(TransportError):
        Client(f"shm://{tmp_path}")


def test_a_client_refuses_to_be_used_across_fork(shm_url: str) -> None:
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        dq.enqueue("forked", b"parent")
        transport._pid = -1  # what a forked child would see: a pid that is not the opener's
        with pytest.raises(TransportError, match="fork"):
            dq.enqueue("forked", b"child")


def test_batches_through_the_ring(shm_url: str) -> None:
    """A batch of PUTs is one engine batch, a dequeue answer of ~1 MB comes back in a
    thousand chunks intact, and a batch of releases answers item by item."""
    values = [bytes([i % 251]) * 1000 for i in range(1000)]
    with Client(shm_url) as dq:
        done = dq.enqueue_many("batches", values)
        assert [e.id for e in done] == list(range(done[0].id, done[0].id + 1000))
        items = dq.dequeue("batches", count=1000)
        assert [i.value for i in items] == values
        assert dq.health()["status"] == "ok"  # the extra CONTINUEs left nothing behind
        stale = items[0]
        dq.release("batches", stale.id, stale.receipt)
        outcomes = dq.release_many("batches", items[:3])
        assert [(o.id, o.ok, o.error) for o in outcomes] == [
            (stale.id, False, "stale_receipt"),
            (items[1].id, True, None),
            (items[2].id, True, None),
        ]
        assert all(o.ok for o in dq.release_many("batches", items[3:]))
        assert dq.queue("batches").stats.pending == 0


def test_a_dequeue_carries_the_releases_of_earlier_deliveries(shm_url: str) -> None:
    with Client(shm_url) as dq:
        dq.enqueue_many("one-trip", [b"a", b"b", b"c"])
        first = dq.dequeue("one-trip", count=2)
        assert first.released == []
        stale = first[0]
        dq.release("one-trip", stale.id, stale.receipt)
        second = dq.dequeue("one-trip", count=2, release=[first[1], stale])
        assert [(o.id, o.ok, o.error) for o in second.released] == [
            (first[1].id, True, None),
            (stale.id, False, "stale_receipt"),
        ]
        assert [i.value for i in second] == [b"c"]
        last = dq.dequeue("one-trip", release=second)
        assert list(last) == [] and [o.ok for o in last.released] == [True]
        assert dq.queue("one-trip").stats.pending == 0


def test_a_worker_may_start_before_its_producer(shm_url: str) -> None:
    """Over the ring as over HTTP: a dequeue of a queue not created yet answers no items,
    and a long-poll on it waits, then wakes when the producer creates and fills it."""
    with Client(shm_url) as dq:
        assert dq.dequeue("not-yet-a", count=1) == []

    async def run() -> list[bytes]:
        async with AsyncClient(shm_url) as worker:
            waiter = asyncio.create_task(worker.dequeue("not-yet-b", count=1, wait_ms=8_000))
            await asyncio.sleep(0.5)
            assert not waiter.done()
            async with AsyncClient(shm_url) as producer:
                await producer.enqueue("not-yet-b", b"first job")
            items = await asyncio.wait_for(waiter, 15)
            await worker.release_many("not-yet-b", items)
            return [i.value for i in items]

    assert asyncio.run(run()) == [b"first job"]
    with Client(shm_url) as dq, pytest.raises(QueueNotFound):
        dq.release("not-yet-c", 1, "0.1.1")  # writes to a missing queue stay 404
