"""``*_many`` calls with lists longer than one request takes, against a real ``dq serve``.

Every client flavour (blocking and asyncio, over HTTP and over shared memory) sends a
long list as several requests the server accepts and answers one result per item in
order; an empty list is answered ``[]`` without a request; a request that fails after
earlier ones went through raises an error carrying what they did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from dq.client import AsyncClient, Client, ClientError, NewItem, Release, TooLarge
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # live dq serve processes

#: the server's default batch limit, and a body limit small enough to meet in a test
ENV = {"DQ_SHM": "1", "DQ_MAX_BODY_BYTES": "200000"}

FLAVOURS = ["http", "shm", "async-http", "async-shm"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=ENV) as s:
        yield s


class Flavour:
    """One client flavour driven through blocking calls (the async ones via asyncio.run)."""

    def __init__(self, name: str, server: LiveServer, **options: Any) -> None:
        self.name = name
        self.url = f"shm://{server.data_dir}" if name.endswith("shm") else server.url
        self.options = options

    def call(self, method: str, *args: Any) -> Any:
        if not self.name.startswith("async"):
            with Client(self.url, **self.options) as dq:
                return getattr(dq, method)(*args)

        async def run() -> Any:
            async with AsyncClient(self.url, **self.options) as dq:
                return await getattr(dq, method)(*args)

        return asyncio.run(run())


@pytest.fixture(params=FLAVOURS)
def flavour(request: pytest.FixtureRequest, server: LiveServer) -> Flavour:
    return Flavour(request.param, server)


def values_in_order(dq: Client, queue: str) -> list[bytes]:
    """The queue's values in id order, read without leasing them."""
    seen: dict[int, bytes] = {}
    after = None
    while True:
        page = dq.browse(queue, after=after, limit=1000, values=True)
        seen.update((i.id, i.value or b"") for i in page.items)
        if page.next is None:
            return [seen[i] for i in sorted(seen)]
        after = page.next


def test_a_long_list_is_enqueued_in_order(server: LiveServer, flavour: Flavour) -> None:
    queue = f"long-{flavour.name}"
    values = [f"v{n}".encode() for n in range(2_500)]  # 2.5 times the server's limit
    done = flavour.call("enqueue_many", queue, values)
    assert len(done) == 2_500
    ids = [e.id for e in done]
    assert ids == sorted(ids) and len(set(ids)) == 2_500
    with Client(server.url) as dq:
        assert values_in_order(dq, queue) == values
        assert dq.queue(queue).stats.pending == 2_500


def test_a_long_list_is_released(server: LiveServer, flavour: Flavour) -> None:
    queue = f"release-{flavour.name}"
    with Client(server.url) as dq:
        dq.enqueue_many(queue, [b"x"] * 2_100)
        leased = [i for _ in range(3) for i in dq.dequeue(queue, count=1000, lease_ms=60_000)]
    assert len(leased) == 2_100
    outcomes = flavour.call("release_many", queue, leased)
    assert [o.id for o in outcomes] == [i.id for i in leased]
    assert all(o.ok for o in outcomes)
    with Client(server.url) as dq:
        assert dq.queue(queue).stats.pending == 0


@pytest.mark.parametrize("method", ["enqueue_many", "release_many", "requeue_many", "extend_many"])
def test_an_empty_list_is_an_empty_answer(flavour: Flavour, method: str) -> None:
    assert flavour.call(method, f"empty-{flavour.name}", []) == []


def test_a_failed_batch_carries_what_was_enqueued_before_it(
    server: LiveServer, flavour: Flavour
) -> None:
    """The second request is refused (a key longer than the server allows): the error
    carries the first request's 1,000 items, which stay enqueued; the third request is
    never sent."""
    queue = f"partial-{flavour.name}"
    items = [NewItem(f"v{n}".encode()) for n in range(2_500)]
    items[1_500] = NewItem(b"bad", key="k" * 200)
    with pytest.raises(ClientError) as failed:
        flavour.call("enqueue_many", queue, items)
    assert getattr(failed.value, "status", None) == 400
    done = failed.value.done
    assert len(done) == 1_000
    with Client(server.url) as dq:
        assert values_in_order(dq, queue) == [i.value for i in items[:1_000]]
        assert [e.id for e in done] == [b.id for b in dq.browse(queue, limit=1000).items]


def test_a_body_over_the_server_limit_is_sent_in_halves(
    server: LiveServer, flavour: Flavour
) -> None:
    queue = f"body-{flavour.name}"
    values = [bytes([65 + n % 26]) * 10_000 for n in range(100)]  # ~1 MB, the limit 200 kB
    done = flavour.call("enqueue_many", queue, values)
    assert len(done) == 100
    with Client(server.url) as dq:
        assert values_in_order(dq, queue) == values
    with pytest.raises(TooLarge) as refused:  # one item over the limit: no half to send
        flavour.call("enqueue_many", queue, [b"x" * 300_000])
    assert refused.value.code == "body_too_large" and refused.value.done == []


def test_a_server_with_a_lower_limit_is_learned(tmp_path: Any) -> None:
    """A server whose DQ_MAX_BATCH is below the client's 1,000: the refused request is
    sent again in halves, and the client keeps the smaller size for its next calls."""
    with (
        live_server(tmp_path / "data", env={"DQ_SHM": "1", "DQ_MAX_BATCH": "300"}) as server,
        Client(server.url) as dq,
    ):
        done = dq.enqueue_many("lower", [f"v{n}".encode() for n in range(1_100)])
        assert len(done) == 1_100
        assert dq.batches.max_batch <= 300
        assert values_in_order(dq, "lower") == [f"v{n}".encode() for n in range(1_100)]
        leased = [i for _ in range(4) for i in dq.dequeue("lower", count=300)]
        assert all(
            o.ok for o in dq.release_many("lower", [Release(i.id, i.receipt) for i in leased])
        )
        assert dq.queue("lower").stats.pending == 0


def test_max_batch_must_be_a_positive_count(server: LiveServer) -> None:
    bad: list[Callable[[], Any]] = [
        lambda: Client(server.url, max_batch=0),
        lambda: AsyncClient(server.url, max_batch=-1),
    ]
    for make in bad:
        with pytest.raises(ValueError, match="max_batch"):
            make()
