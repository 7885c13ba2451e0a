"""Followers send clients to the leader, and every client follows: real servers.

Two dq servers run in this process (``tests/server/threaded.py``: uvicorn, our protocol,
the app, the shm server), so that ``Engine.set_role(False, leader_url)`` makes one a
follower of the other; clients reach both over real sockets (and the command ring). The
two engines do not replicate here: what a test checks is where each request was carried
out — on the leader, never on the follower.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.client import AsyncClient, Client, NotLeaderError, Unavailable
from dq.client.groups import ConsumerClient, KeyedEnqueuer
from tests.server.live import REPO, free_port
from tests.server.threaded import ThreadedServer, threaded_server

# integration: in-process servers on 127.0.0.1
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ThreadedServer, ThreadedServer]]:
    base: Path = tmp_path_factory.mktemp("dq-redirect")
    with (
        threaded_server(base / "leader", fsync="never", expire_interval_ms=50) as leader,
        threaded_server(base / "follower", fsync="never", expire_interval_ms=50) as follower,
    ):
        yield leader, follower


@pytest.fixture
def leader(pair: tuple[ThreadedServer, ThreadedServer]) -> ThreadedServer:
    return pair[0]


@pytest.fixture
def follower(pair: tuple[ThreadedServer, ThreadedServer]) -> Iterator[ThreadedServer]:
    leader, follower = pair
    follower.engine.set_role(False, leader.url)
    try:
        yield follower
    finally:
        follower.engine.set_role(True)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"


def pending(server: ThreadedServer, queue: str) -> int:
    try:
        return server.engine.stats(queue).pending
    except Exception:  # no such queue there
        return 0


def test_the_client_follows_a_followers_421(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    with Client(follower.url) as dq:
        ids = [dq.enqueue(queue, b"one"), dq.enqueue(queue, b"two")]
        assert dq.transport.leader == leader.url  # type: ignore[attr-defined]
        got = dq.dequeue(queue, count=2)
        assert [i.id for i in got] == ids
        dq.release(queue, got[0].id, got[0].receipt)
        assert dq.queue(queue).stats.pending == 1
    assert pending(leader, queue) == 1 and pending(follower, queue) == 0


def test_a_dead_first_url_then_a_follower(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    with Client(f"{dead_url()},{follower.url}", retries=0) as dq:
        dq.enqueue_many(queue, [b"a", b"b"])
    assert pending(leader, queue) == 2 and pending(follower, queue) == 0


def test_the_async_client_follows(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    async def run() -> list[int]:
        async with AsyncClient([dead_url(), follower.url], retries=0) as dq:
            first = await dq.enqueue(queue, b"x")
            got = await dq.dequeue(queue, count=1)
            await dq.release(queue, got[0].id, got[0].receipt)
            return [first, got[0].id]

    first, taken = asyncio.run(run())
    assert first == taken and pending(leader, queue) == 0
    assert leader.engine.stats(queue).next_id == first + 1


def test_followers_naming_each_other_end_in_a_clear_error(
    pair: tuple[ThreadedServer, ThreadedServer], queue: str
) -> None:
    a, b = pair
    a.engine.set_role(False, b.url)
    b.engine.set_role(False, a.url)
    try:
        with Client(a.url, retries=1, failover_s=0.5) as dq, pytest.raises(NotLeaderError) as err:
            dq.enqueue(queue, b"x")
        assert f"{a.url} named {b.url}" in str(err.value)
        a.engine.set_role(False, None)  # an election: no leader known anywhere
        b.engine.set_role(False, None)
        with (
            Client([a.url, b.url], retries=1, failover_s=0.3) as dq,
            pytest.raises(Unavailable) as no,
        ):
            dq.enqueue(queue, b"x")
        assert no.value.code == "no_leader"
    finally:
        a.engine.set_role(True)
        b.engine.set_role(True)
    assert pending(a, queue) == 0 and pending(b, queue) == 0


def test_a_leader_whose_term_may_be_over_hands_out_nothing(
    leader: ThreadedServer, queue: str
) -> None:
    """A leader is told to ask whether its term surely lives at every write and dequeue
    (the replica node passes its etcd lease's check): once the answer is no, dequeues
    over HTTP (the fast path and the app), over the ring and writes are refused with 503
    no_leader before the role is taken away, and nothing is leased or lost meanwhile."""
    alive = [True]
    with Client(leader.url) as dq:
        dq.enqueue(queue, b"one")
        leader.engine.set_role(True, None, alive=lambda: alive[0])
        try:
            alive[0] = False
            fast = httpx.post(f"{leader.url}/v1/queues/{queue}/dequeue", json={}, timeout=10)
            assert fast.status_code == 503, fast.text  # not 200 with the item
            assert fast.json()["error"] == "no_leader"
            app = httpx.post(  # a long-poll's fields: the app's route
                f"{leader.url}/v1/queues/{queue}/dequeue?x=1", json={"count": 1}, timeout=10
            )
            assert app.status_code == 503, app.text  # not 200 with the item
            assert app.json()["error"] == "no_leader"
            with (
                Client(f"shm://{leader.settings.data_dir}", retries=0) as ring,
                pytest.raises(Unavailable),
            ):
                ring.dequeue(queue)
            with Client(leader.url, retries=0) as late, pytest.raises(Unavailable) as no:
                late.enqueue(queue, b"two")
            assert no.value.code == "no_leader"
            assert leader.engine.stats(queue).leased == 0
            alive[0] = True  # a lease renewed in time: the same term goes on
            assert [i.value for i in dq.dequeue(queue)] == [b"one"]
        finally:
            leader.engine.set_role(True)


def test_a_new_leader_is_followed_after_a_failover(
    pair: tuple[ThreadedServer, ThreadedServer], queue: str
) -> None:
    """The roles swap between two calls: the remembered leader refuses, names the other."""
    a, b = pair
    b.engine.set_role(False, a.url)
    try:
        with Client([b.url, a.url]) as dq:
            dq.enqueue(queue, b"1")
            assert dq.transport.leader == a.url  # type: ignore[attr-defined]
            b.engine.set_role(True)
            a.engine.set_role(False, b.url)
            dq.enqueue(queue, b"2")
            assert dq.transport.leader == b.url  # type: ignore[attr-defined]
    finally:
        a.engine.set_role(True)
        b.engine.set_role(True)
    assert pending(a, queue) == 1 and pending(b, queue) == 1


def test_consumer_groups_and_keyed_batches_are_the_leaders(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    raw = httpx.post(f"{follower.url}/v1/queues/{queue}/consumers/spark/pull", json={"after": 0})
    assert raw.status_code == 421 and raw.headers["x-dq-leader"] == leader.url
    assert httpx.get(f"{follower.url}/v1/queues/{queue}/consumers").status_code == 421
    with KeyedEnqueuer(follower.url, queue) as writer:
        writer.enqueue("batch-1", [(b"a", None, None), (b"b", None, None)])
    with ConsumerClient(follower.url, queue, "spark") as consumer:
        consumer.open(lease_ms=30_000)
        pulled = consumer.pull(0, 10)
        assert pulled.end - pulled.start == 2
        assert len(consumer.read(pulled.start, pulled.end).items) == 2
        assert consumer.commit(pulled.end).released == 2
    assert pending(leader, queue) == 0 and pending(follower, queue) == 0


def test_the_sqs_endpoint_names_the_leader(
    leader: ThreadedServer, follower: ThreadedServer
) -> None:
    json_call = httpx.post(
        follower.url + "/",
        content=b"{}",
        headers={
            "content-type": "application/x-amz-json-1.0",
            "x-amz-target": "AmazonSQS.ListQueues",
        },
    )
    assert json_call.status_code == 503
    assert json_call.json()["__type"] == "com.amazonaws.sqs#ServiceUnavailable"
    assert leader.url in json_call.json()["message"]
    assert json_call.headers["x-dq-leader"] == leader.url
    query = httpx.post(follower.url + "/", data={"Action": "ListQueues", "Version": "2012-11-05"})
    assert query.status_code == 503 and query.headers["x-dq-leader"] == leader.url
    assert b"<Code>ServiceUnavailable</Code>" in query.content


def test_reads_are_served_by_a_follower(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    follower.engine.set_role(True)
    with Client(follower.url) as dq:
        dq.enqueue(queue, b"local")  # while it still leads
    follower.engine.set_role(False, leader.url)
    with Client(follower.url) as dq:
        assert dq.queue(queue).stats.pending == 1  # a read: answered here, no redirect
        assert dq.transport.leader == follower.url  # type: ignore[attr-defined]
        page = dq.browse(queue)
        assert [i.id for i in page.items] == [1]


def test_the_cli_follows_with_several_urls(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    urls = f"{dead_url()},{follower.url}"
    put = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", "put", queue, "v1", "v2", "--url", urls],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert put.returncode == 0, put.stderr
    env_url = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", "get", queue, "-n", "5", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"PATH": "/usr/bin:/bin", "DQ_URL": follower.url},
    )  # fmt: skip
    assert env_url.returncode == 0, env_url.stderr
    assert env_url.stdout.count('"value"') == 2
    assert pending(leader, queue) == 2 and pending(follower, queue) == 0


def test_the_cli_says_why_when_no_leader_answers(
    pair: tuple[ThreadedServer, ThreadedServer], queue: str
) -> None:
    a, b = pair
    a.engine.set_role(False, b.url)
    b.engine.set_role(False, a.url)
    try:
        t0 = time.monotonic()
        put = subprocess.run(
            [sys.executable, "-m", "dq.cli.main", "put", queue, "v", "--url", a.url],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        a.engine.set_role(True)
        b.engine.set_role(True)
    assert put.returncode == 1
    assert "not_leader" in put.stderr and f"{b.url} named {a.url}" in put.stderr
    assert time.monotonic() - t0 < 30


def test_shm_falls_back_to_http_at_the_leader(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    with Client(f"shm://{follower.settings.data_dir}") as dq:
        first = dq.enqueue(queue, b"over http")
        got = dq.dequeue(queue, count=1)
        assert [i.id for i in got] == [first]
        assert dq.release_many(queue, got)[0].ok
        dq.enqueue_many(queue, [b"a", b"b"])
    assert pending(leader, queue) == 2 and pending(follower, queue) == 0


def test_shm_on_a_follower_sends_its_writes_over_http_for_a_spell(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    """Once the follower's ring refused, the next writes and dequeues go straight over
    HTTP (the ring's head stays where it was); health, any server's, stays on the ring."""
    from dq.client.shm_transport import ShmTransport
    from dq.shm import _atomics

    with Client(f"shm://{follower.settings.data_dir}") as dq:
        transport = dq.transport
        assert isinstance(transport, ShmTransport)

        def head() -> int:
            return int(_atomics.load_u64(transport._ring._mm, 0))

        before = head()
        dq.enqueue(queue, b"refused, then over http")
        assert head() > before  # tried on the ring first
        before = head()
        second = dq.enqueue(queue, b"straight over http")
        assert [e.id for e in dq.enqueue_many(queue, [b"a"])] == [second + 1]
        first, *rest = dq.dequeue(queue, count=5)
        dq.release(queue, first.id, first.receipt)
        assert dq.release_many(queue, rest[:1])[0].ok
        assert head() == before
        assert dq.health()["transport"] == "shm"
        assert head() > before
    assert pending(leader, queue) == 1 and pending(follower, queue) == 0


def test_shm_batches_refused_by_a_follower_go_to_the_leader(
    leader: ThreadedServer,
    follower: ThreadedServer,
    queue: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every call tries the ring first (no spell of HTTP calls): the follower refuses a
    PUT_MANY, a FIND with PARTs before it and a DELETE_MANY before doing anything, and each
    is sent again to the leader, whole, with one answer per item."""
    from dq.client import shm_transport

    monkeypatch.setattr(shm_transport, "HTTP_SPELL_S", 0.0)
    with Client(f"shm://{follower.settings.data_dir}") as dq:
        done = dq.enqueue_many(queue, [b"v" * 300] * 20)
        assert [e.id for e in done] == list(range(done[0].id, done[0].id + 20))
        got = dq.dequeue(queue, count=10)
        assert [i.id for i in got] == [e.id for e in done[:10]]
        assert all(o.ok for o in dq.release_many(queue, got[:5]))
        more = dq.dequeue(queue, count=10, release=got[5:])
        assert [o.ok for o in more.released] == [True] * 5 and len(more) == 10
        assert all(o.ok for o in dq.release_many(queue, more))
    assert leader.engine.stats(queue).next_id == done[-1].id + 1
    assert pending(leader, queue) == 0 and pending(follower, queue) == 0


def test_a_leader_turned_follower_drops_its_consumer_logs(
    pair: tuple[ThreadedServer, ThreadedServer], queue: str
) -> None:
    """Its leases are void once another node leads (the items come back there by expiry);
    the keep-alive thread drops the logs instead of failing every second."""
    a, b = pair
    with Client(a.url) as dq:
        dq.enqueue(queue, b"held")
    with ConsumerClient(a.url, queue, "c") as consumer:
        consumer.open(lease_ms=5_000)
        assert consumer.pull(0, 10).pulled == 1
    groups = a.app.state.service.groups
    assert [c.consumer for c in groups.consumers(queue)] == ["c"]
    a.engine.set_role(False, b.url)
    try:
        give_up = time.monotonic() + 15
        while groups.consumers(queue) and time.monotonic() < give_up:
            time.sleep(0.1)
        assert groups.consumers(queue) == [] and groups.total_bytes() == 0
    finally:
        a.engine.set_role(True)


def test_shm_on_a_follower_without_a_leader_uses_the_other_urls(
    leader: ThreadedServer, follower: ThreadedServer, queue: str
) -> None:
    """The ring says no_leader; the local server knows none either; the URLs given after
    the shm:// address lead on."""
    follower.engine.set_role(False, None)
    with Client(f"shm://{follower.settings.data_dir},{leader.url}") as dq:
        dq.enqueue_many(queue, [b"a", b"b"])
        got = dq.dequeue(queue, count=2)
        assert len(got) == 2
        assert all(o.ok for o in dq.release_many(queue, got))
    assert leader.engine.stats(queue).next_id == 3 and pending(leader, queue) == 0
    assert pending(follower, queue) == 0
