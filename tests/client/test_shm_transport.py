"""``Client("shm:///data-dir")`` against a real ``dq serve`` with shared memory on: the same
API and answers as over HTTP; a batch is one ring command, and only what no command can
hold goes over HTTP, transparently."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dq.client import (
    AsyncClient,
    BadRequest,
    Client,
    ItemNotFound,
    NewItem,
    QueueConfig,
    QueueNotFound,
    Release,
    StaleReceipt,
)
from dq.client._calls import (
    Dequeue,
    EnqueueMany,
    EnqueueOne,
    ExtendMany,
    ReleaseMany,
    ReleaseOne,
    RequeueMany,
)
from dq.client.errors import ServerError, TransportError, ValidationError
from dq.client.shm_transport import LONG_POLL_SLICE_MS, ShmTransport
from dq.shm import _atomics as at
from dq.shm.attach import SHM_DIR, shm_prefix
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # live dq serve processes

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "50"}


@pytest.fixture(scope="module")
def backups(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("backups")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, backups: Path) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq") / "data"
    with live_server(data, env={**ENV, "DQ_BACKUP_DIR": str(backups)}) as s:
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


def test_values_over_a_slot_ride_the_ring_and_only_what_no_command_holds_goes_over_http(
    shm_url: str,
) -> None:
    big = bytes(range(256)) * 16  # 4 KiB: a PUT_MANY over five slots
    huge = bytes(range(256)) * 1200  # 300 KiB: more than a 256-slot ring holds at once
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        http_url, transport.http_url = transport.http_url, None  # any HTTP call would fail
        item_id = dq.enqueue("big", big)
        fits = dq.enqueue("big", b"x" * 1024)
        with pytest.raises(TransportError, match="needs HTTP"):
            dq.enqueue("big", huge)
        transport.http_url = http_url
        huge_id = dq.enqueue("big", huge)
        items = dq.dequeue("big", count=3)  # comes back through the ring, in chunks
        assert [(i.id, i.value) for i in items] == [
            (item_id, big),
            (fits, b"x" * 1024),
            (huge_id, huge),
        ]
        dq.release_many("big", items)


def test_a_debounce_rides_the_ring(shm_url: str) -> None:
    """An enqueue with on_duplicate "replace" is a PUT_MANY with the REPLACE flag: the
    key's pending item takes the new value and deadline, without HTTP; a batch whose
    keyed items mix "keep" and "replace" is handed to HTTP whole."""
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        http_url, transport.http_url = transport.http_url, None  # any HTTP call would fail
        first = dq.enqueue("debounce", b"v1", delay_ms=60_000, key="d", on_duplicate="replace")
        again, _free = dq.enqueue_many(
            "debounce",
            [NewItem(b"v2", delay_ms=0, key="d", on_duplicate="replace"), NewItem(b"free")],
        )
        assert (again.id, again.replaced, again.duplicate) == (first, True, False)
        [kept] = dq.enqueue_many("debounce", [NewItem(b"v3", key="d")])
        assert (kept.id, kept.replaced, kept.duplicate) == (first, False, True)
        mixed = [NewItem(b"a", key="a"), NewItem(b"b", key="b", on_duplicate="replace")]
        with pytest.raises(TransportError, match="needs HTTP"):
            dq.enqueue_many("debounce", mixed)
        transport.http_url = http_url
        assert [e.replaced for e in dq.enqueue_many("debounce", mixed)] == [False, False]
        items = dq.dequeue("debounce", count=10)
        assert sorted(i.value for i in items) == [b"a", b"b", b"free", b"v2"]
        dq.release_many("debounce", items)


def test_queue_administration_goes_over_http(shm_url: str) -> None:
    with Client(shm_url) as dq:
        info = dq.put_queue("admin", QueueConfig(default_lease_ms=5_000, max_deliveries=3))
        assert info.config.max_deliveries == 3
        assert "admin" in [q.name for q in dq.queues()]
        assert dq.queue("admin").config.default_lease_ms == 5_000
        dq.delete_queue("admin")
        with pytest.raises(QueueNotFound):
            dq.queue("admin")


def test_the_calls_the_ring_does_not_carry_go_over_http(
    server: LiveServer, shm_url: str, backups: Path
) -> None:
    """Operating a queue from a shm:// client: each call is handed whole to HTTP and
    answers as there, errors too."""
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        a, b, c = (e.id for e in dq.enqueue_many("operate", [b"a", b"b", b"c"]))
        assert dq.pause("operate").stats.paused
        assert dq.dequeue("operate") == []
        assert not dq.resume("operate").stats.paused
        page = dq.browse("operate", limit=2, values=True)
        assert [(i.id, i.value) for i in page.items] == [(a, b"a"), (b, b"b")]
        assert [i.id for i in dq.browse("operate", after=page.next).items] == [c]
        assert dq.peek("operate", c).state == "due"
        dq.delete_item("operate", b)
        with pytest.raises(ItemNotFound):
            dq.delete_item("operate", b)
        with pytest.raises(BadRequest) as err:
            dq.redrive("operate")
        assert err.value.code == "not_a_dead_letter_queue"
        assert dq.redrive("operate", to="operate-elsewhere", limit=1).moved == 1
        assert dq.purge("operate") == 1
        done = dq.backup("from-ring")
        assert done.path == str(backups / "from-ring") and done.bytes > 0
        with pytest.raises(BadRequest):
            dq.backup("from-ring")  # it exists
        assert transport._http is not None  # they went over HTTP ...
        transport.http_url = None
        transport._http.close()
        transport._http = None
        with pytest.raises(TransportError, match="needs HTTP"):
            dq.purge("operate")  # ... and only there

    async def run() -> None:
        async with AsyncClient(shm_url) as dq:
            item_id = await dq.enqueue("operate-async", b"x")
            assert (await dq.pause("operate-async")).stats.paused
            assert (await dq.peek("operate-async", item_id)).value == b"x"
            assert [i.id for i in (await dq.browse("operate-async")).items] == [item_id]
            assert (await dq.backup("from-async-ring")).bytes > 0
            assert await dq.purge("operate-async") == 1
            assert "operate-async" in [q.name for q in await dq.queues()]
            await dq.delete_queue("operate-async")

    asyncio.run(run())


def test_the_calls_the_ring_carries_build_no_json(
    shm_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over the ring a call is its arguments: its HTTP body is never made."""

    def no_json(call: object) -> object:
        raise AssertionError(f"{call!r} made its HTTP body")

    ring_calls = (
        EnqueueOne,
        EnqueueMany,
        Dequeue,
        ReleaseOne,
        ReleaseMany,
        RequeueMany,
        ExtendMany,
    )
    for kind in ring_calls:
        monkeypatch.setattr(kind, "json", no_json)
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        transport.http_url = None  # and nothing goes over HTTP
        dq.enqueue("no-json", b"one")
        dq.enqueue_many("no-json", [b"two", NewItem(b"three", key="k")])
        one, two, three = dq.dequeue("no-json", count=3, lease_ms=60_000)
        dq.release("no-json", one.id, one.receipt)
        assert dq.extend("no-json", two.id, two.receipt, 60_000).ok
        assert dq.requeue("no-json", three.id, three.receipt) > 0
        again = dq.dequeue("no-json", release=[two])
        assert [i.id for i in again] == [three.id] and again.released[0].ok
        assert dq.release_many("no-json", again)[0].ok
        assert dq.queue("no-json").stats.pending == 0
        assert dq.health()["transport"] == "shm"


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
        pid = os.fork()
        if pid == 0:  # the child: refused before it touches the ring
            try:
                dq.enqueue("forked", b"child")
            except TransportError as exc:
                os._exit(0 if "fork" in str(exc) else 1)
            os._exit(2)
        give_up = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert dq.enqueue("forked", b"parent again") > 0  # the parent's client goes on


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


def ring_head(dq: Client) -> int:
    transport = dq.transport
    assert isinstance(transport, ShmTransport)
    return int(at.load_u64(transport._ring._mm, 0))


def test_a_batch_is_one_command_and_never_touches_http(shm_url: str) -> None:
    """enqueue_many of 100 items of 256 bytes takes 28 slots (PARTs and one PUT_MANY), not
    100; a dequeue of 100 and their release come back whole; keys work as over HTTP."""
    value = b"v" * 256
    with Client(shm_url) as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        transport.http_url = None  # any HTTP call would fail
        dq.enqueue("one-command", b"bind first")
        before = ring_head(dq)
        done = dq.enqueue_many("one-command", [value] * 100)
        assert (ring_head(dq) - before) % transport._ring.capacity == (100 * 277 + 1023) // 1024
        assert [e.id for e in done] == list(range(done[0].id, done[0].id + 100))
        assert not any(e.duplicate for e in done)

        first = dq.dequeue("one-command", count=1)
        items = dq.dequeue("one-command", count=100, lease_ms=60_000)
        assert [i.id for i in items] == [e.id for e in done]
        assert all(i.value == value for i in items)
        dq.release("one-command", items[0].id, items[0].receipt)
        outcomes = dq.release_many("one-command", items[:50])
        assert [(o.id, o.ok, o.error) for o in outcomes[:2]] == [
            (items[0].id, False, "stale_receipt"),
            (items[1].id, True, None),
        ]
        assert outcomes[0].message and all(o.ok for o in outcomes[1:])
        rest = dq.dequeue("one-command", count=10, release=[*first, *items[50:]])
        assert list(rest) == [] and len(rest.released) == 51
        assert all(o.ok for o in rest.released)
        assert dq.queue("one-command").stats.pending == 0

        keyed = [NewItem(b"a", key="order-1"), NewItem(b"b", key="order-2")]
        once = dq.enqueue_many("keyed", keyed)
        again = dq.enqueue_many("keyed", [*keyed, NewItem(b"c")])
        assert [(e.id, e.duplicate) for e in again[:2]] == [(e.id, True) for e in once]
        assert not again[2].duplicate
        assert dq.enqueue("keyed", b"a", key="order-1") == once[0].id
        assert dq.queue("keyed").stats.pending == 3


def test_a_refused_batch_writes_nothing(shm_url: str) -> None:
    """One bad item refuses the whole PUT_MANY, as an HTTP batch is refused."""
    with Client(shm_url) as dq:
        dq.enqueue("all-or-nothing", b"x")
        for bad in ("k" * 200, ""):  # over the server's 128 bytes; empty (sent over HTTP)
            with pytest.raises(ServerError) as refused:
                dq.enqueue_many("all-or-nothing", [NewItem(b"ok"), NewItem(b"bad", key=bad)])
            assert refused.value.status == 400
        assert dq.queue("all-or-nothing").stats.pending == 1


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


def test_a_single_release_fails_as_over_http(server: LiveServer, shm_url: str) -> None:
    """``release`` of one item over the ring (one DELETE, no batch bookkeeping) raises
    what the HTTP client raises, for every way it can fail, and returns None otherwise."""
    with Client(shm_url) as dq, Client(server.url) as http:
        dq.enqueue("one-release", b"x")
        (item,) = dq.dequeue("one-release", lease_ms=60_000)
        cases = [
            ("one-release", item.id + 1000, item.receipt),  # no such item
            ("one-release", item.id, "not-a-receipt"),  # a receipt of nothing
            ("one-release", item.id, "é"),  # not ASCII: cannot go through the ring
            ("no-such-queue", item.id, item.receipt),
        ]
        for queue, item_id, receipt in cases:
            errors = []
            for client in (dq, http):
                with pytest.raises(ServerError) as err:
                    client.release(queue, item_id, receipt)
                errors.append((type(err.value), err.value.code))
            assert errors[0] == errors[1], (queue, item_id, receipt, errors)
        assert dq.release("one-release", item.id, item.receipt) is None
        with pytest.raises(StaleReceipt):
            dq.release("one-release", item.id, item.receipt)
        assert dq.queue("one-release").stats.pending == 0


def test_arguments_the_ring_cannot_carry_are_refused_as_over_http(
    server: LiveServer, shm_url: str
) -> None:
    """A count or lease of 0 means "not given" in a ring field, and a negative number
    fits none: over the ring they are refused as over HTTP (422), and nothing is leased."""
    with Client(shm_url) as dq, Client(server.url) as http:
        dq.enqueue_many("bad-args", [b"a", b"b"])
        (item,) = dq.dequeue("bad-args", lease_ms=60_000)
        calls: list[Callable[[Client], object]] = [
            lambda c: c.dequeue("bad-args", count=0),
            lambda c: c.dequeue("bad-args", count=-1),
            lambda c: c.dequeue("bad-args", lease_ms=0),
            lambda c: c.dequeue("bad-args", lease_ms=-1),
            lambda c: c.dequeue("bad-args", wait_ms=-1),
            lambda c: c.requeue("bad-args", item.id, item.receipt, delay_ms=-5),
            lambda c: c.requeue("bad-args", item.id, item.receipt, deadline=-5),
            lambda c: c.extend("bad-args", item.id, item.receipt, -1),
            lambda c: c.extend("bad-args", item.id, item.receipt, 0),
        ]
        for call in calls:
            for client in (dq, http):
                with pytest.raises(ValidationError) as refused:
                    call(client)
                assert refused.value.status == 422
        stats = dq.queue("bad-args").stats
        assert (stats.due, stats.leased) == (1, 1)  # only the one good dequeue leased
        dq.release("bad-args", item.id, item.receipt)  # its delivery is untouched


def test_a_client_waiting_on_a_server_that_dies_hears_so_at_once(tmp_path: Path) -> None:
    """SIGKILL the server while a ring client long-polls: the client raises a
    TransportError that says the server is gone within a second, not at the end of its
    timeout plus the wait, and later calls fail at once instead of timing out each."""
    data = tmp_path / "data"
    with live_server(data, env=ENV) as server, Client(f"shm://{data}", timeout=30) as dq:
        dq.enqueue("dies", b"x")
        assert dq.dequeue("dies", lease_ms=60_000)
        killer = threading.Timer(0.5, server.kill)
        killer.start()
        started = time.monotonic()
        with pytest.raises(TransportError, match="server is gone"):
            dq.dequeue("dies", wait_ms=20_000)
        killer.join()
        assert time.monotonic() - started < 5
        started = time.monotonic()
        with pytest.raises(TransportError, match="cannot attach"):  # no server to attach to
            dq.enqueue("dies", b"y")
        assert time.monotonic() - started < 1


def test_a_client_carries_on_when_its_server_comes_back(tmp_path: Path) -> None:
    """Stop the server (an upgrade) and start it again, on another port: the same ring
    client carries on, as an HTTP client reconnects; while no server runs, its calls fail
    at once. What it sends over HTTP goes to the new server's port."""
    data = tmp_path / "data"
    with live_server(data, env=ENV) as first, Client(f"shm://{data}") as dq:
        dq.enqueue("restarts", b"before")
        first.terminate()
        for _ in range(2):  # the ring's server is gone; then there is none to attach to
            with pytest.raises(TransportError):
                dq.enqueue("restarts", b"refused")
        with live_server(data, env=ENV) as second:
            assert dq.enqueue("restarts", b"after") > 0
            assert [i.value for i in dq.dequeue("restarts", count=5)] == [b"before", b"after"]
            assert dq.transport.http_url == second.url
            assert [q.name for q in dq.queues()] == ["restarts"]


def test_a_deadline_of_zero_sorts_first_as_over_http(server: LiveServer, shm_url: str) -> None:
    """Deadline 0 is the epoch over HTTP (kept: the item is due and sorts first); on the
    ring 0 means "not given" (now). The ring client gives it the HTTP answer."""
    with Client(shm_url) as dq:
        dq.enqueue("epoch", b"now")
        first = dq.enqueue_many("epoch", [NewItem(b"first", deadline=0)])
        assert first[0].deadline == 0
        assert dq.enqueue("epoch", b"also first", deadline=0) == first[0].id + 1
        items = dq.dequeue("epoch", count=3)
        assert [i.value for i in items] == [b"first", b"also first", b"now"]
        dq.release_many("epoch", items)


def test_a_cancelled_async_long_poll_leases_nothing(server: LiveServer, shm_url: str) -> None:
    """``asyncio.wait_for`` gives up on a ring long-poll: as over HTTP, the item another
    producer enqueues next goes to the next dequeue, not to the abandoned one (which held
    it, leased to nobody, until its lease ran out). The abandoned wait ends within one
    ``LONG_POLL_SLICE_MS``."""

    async def run() -> tuple[list[bytes], float]:
        async with AsyncClient(shm_url) as dq:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(dq.dequeue("abandoned", wait_ms=5_000), 0.5)
            await asyncio.sleep(LONG_POLL_SLICE_MS / 1000 + 0.1)
            with Client(server.url) as producer:
                producer.enqueue("abandoned", b"job")
            started = time.monotonic()
            items = await dq.dequeue("abandoned", wait_ms=3_000, lease_ms=60_000)
            await dq.release_many("abandoned", items)
            return [i.value for i in items], time.monotonic() - started

    values, took = asyncio.run(run())
    assert values == [b"job"] and took < 1


def test_a_count_over_the_limit_is_refused_as_over_http(server: LiveServer, shm_url: str) -> None:
    """A dequeue's ``count`` over ``DQ_MAX_BATCH`` is outside its range (422), over the
    ring as over HTTP, in the same words, not a batch too large (413)."""
    with Client(shm_url) as dq, Client(server.url) as http:
        for client in (dq, http):
            with pytest.raises(ServerError) as refused:
                client.dequeue("counted", count=1001)
            got = (refused.value.status, refused.value.code, refused.value.message)
            assert got == (422, "validation_error", "count must be between 1 and 1000")


def test_a_receipt_too_long_is_refused_as_over_http(server: LiveServer, shm_url: str) -> None:
    """A receipt longer than the API takes (512) is a bad argument over the ring too, not
    a TransportError (which reads as "the server is away", and is retried as such)."""
    with Client(shm_url) as dq, Client(server.url) as http:
        dq.enqueue("long-receipt", b"x")
        (item,) = dq.dequeue("long-receipt", lease_ms=60_000)
        long = "a" * 2000
        calls: list[Callable[[Client], object]] = [
            lambda c: c.release("long-receipt", item.id, long),
            lambda c: c.release_many("long-receipt", [Release(item.id, long)]),
            lambda c: c.requeue("long-receipt", item.id, long, delay_ms=1),
            lambda c: c.extend("long-receipt", item.id, long, 1_000),
            lambda c: c.dequeue("long-receipt", release=[Release(item.id, long)]),
        ]
        for call in calls:
            for client in (dq, http):
                with pytest.raises(ValidationError):
                    call(client)
        dq.release("long-receipt", item.id, item.receipt)


def test_a_long_poll_does_not_hold_up_the_other_threads(shm_url: str) -> None:
    """One client shared by threads (one per process, docs/shm.md): while one thread
    long-polls an empty queue, another's enqueue is answered within a slice of the
    long-poll, not after its whole wait, as each thread's call over HTTP would be."""
    with Client(shm_url) as dq:
        poller = threading.Thread(target=dq.dequeue, args=("idle",), kwargs={"wait_ms": 5_000})
        poller.start()
        time.sleep(0.3)
        started = time.monotonic()
        dq.enqueue("busy", b"x")
        took = time.monotonic() - started
        poller.join(10)
        assert took < 1, took


class _LateWaiter:
    """A ring's lock whose waiters look for it every 50 ms, as a thread woken on a busy
    machine runs only once it is given a CPU: a holder that lets it go and takes it back
    at once keeps it from them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True) -> bool:
        while not self._lock.acquire(False):
            if not blocking:
                return False
            time.sleep(0.05)
        return True

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def test_a_long_poll_lets_a_call_waiting_for_the_ring_go_between_its_slices(
    shm_url: str,
) -> None:
    """The long-poll's next slice waits for the calls of other threads already waiting
    for the ring, however late they run: with the ring's lock taken back at once, the
    enqueue here waited out the whole long-poll of 5 s."""
    with Client(shm_url) as dq:
        dq.enqueue("busy", b"w")  # attached
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        transport._ring.lock = _LateWaiter()  # type: ignore[assignment]
        poller = threading.Thread(target=dq.dequeue, args=("idle",), kwargs={"wait_ms": 5_000})
        poller.start()
        time.sleep(0.3)
        started = time.monotonic()
        dq.enqueue("busy", b"x")
        took = time.monotonic() - started
        poller.join(10)
        assert took < 2.0, took  # a slice or two, not the long-poll's 5 s


def test_a_dequeue_says_whether_its_queue_exists(server: LiveServer, shm_url: str) -> None:
    """A worker may start before its producer: the answer is empty, and says the queue
    does not exist (the ring's NO_QUEUE flag, HTTP's ``"queue_exists": false``), alike
    over both transports, long-poll or not, until the queue is created."""
    with Client(shm_url) as dq, Client(server.url) as http:
        for client in (dq, http):
            got = client.dequeue("never-made")
            assert (list(got), got.queue_exists) == ([], False)
            waited = client.dequeue("never-made", wait_ms=LONG_POLL_SLICE_MS * 2 + 50)
            assert (list(waited), waited.queue_exists) == ([], False)
        http.put_queue("made-later")
        for client in (dq, http):
            assert client.dequeue("made-later").queue_exists is True


def test_one_item_calls_answer_as_over_http_and_build_no_answer_objects(
    server: LiveServer, shm_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``enqueue(value)``, ``dequeue()`` and ``release`` of one item are one ring command
    of one slot each (``ShmTransport._one``, ``ClientRing.exchange``): the same ids,
    items and errors as over HTTP, an item whose delivery outgrows its slot back whole
    (its answer continues), and no ``Response`` built for an answer that fits."""
    with Client(shm_url) as dq, Client(server.url) as http:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)
        transport.http_url = None  # nothing goes over HTTP
        assert dq.dequeue("one-slot").queue_exists is False  # bound (a BIND's Response)

        def no_response(*args: object) -> None:
            raise AssertionError(f"a Response was built for {args!r}")

        monkeypatch.setattr("dq.client.shm_transport.Response", no_response)
        monkeypatch.setattr("dq.shm.command_ring.Response", no_response)
        first = dq.enqueue("one-slot", b"one")
        assert dq.enqueue("one-slot", "two") == first + 1
        one = dq.dequeue("one-slot", lease_ms=None)
        two = dq.dequeue("one-slot")
        assert [(i.id, i.value) for i in [*one, *two]] == [(first, b"one"), (first + 1, b"two")]
        assert one.queue_exists and one.released == []
        assert dq.release("one-slot", one[0].id, one[0].receipt) is None
        assert list(dq.dequeue("one-slot")) == []
        monkeypatch.undo()
        http.release("one-slot", two[0].id, two[0].receipt)
        big = bytes(range(256)) * 4  # a full slot: its delivery takes two
        big_id = dq.enqueue("one-slot", big)
        (got,) = dq.dequeue("one-slot")  # one FIND slot: the answer continues
        assert (got.id, got.value) == (big_id, big)
        dq.release("one-slot", got.id, got.receipt)
        assert http.queue("one-slot").stats.pending == 0
