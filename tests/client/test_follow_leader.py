"""The client follows a replicated deployment's leader: scripted nodes on real sockets.

Each node is a ``ScriptedServer`` (a real HTTP/1.1 server on 127.0.0.1): followers
answer the 421 or 503 ``no_leader`` a dq follower answers, the leader answers the call.
The end-to-end twin, with real dq servers, is ``tests/server/test_redirect.py``.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from dq.client import AsyncClient, Client, NotLeaderError, TransportError, Unavailable
from tests.client.scripted import DROP, Answer, ScriptedServer, scripted
from tests.server.live import free_port

pytestmark = pytest.mark.integration  # scripted HTTP servers on 127.0.0.1

ENQUEUED = Answer(200, {"items": [{"id": 7, "deadline": 1}]})
NO_LEADER = Answer(503, {"error": "no_leader", "message": "an election is running"})


def not_leader(url: str | None) -> Answer:
    doc: dict[str, object] = {"error": "not_leader", "message": "this node follows"}
    if url is not None:
        doc["leader"] = url
    return Answer(421, doc)


def dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def test_a_redirect_is_followed_and_the_leader_remembered() -> None:
    with scripted(ENQUEUED) as leader, scripted(not_leader(leader.url)) as follower:
        with Client(follower.url) as dq:
            # an enqueue without a key is never resent after it may have been carried
            # out; a follower's refusal is resent: the follower did nothing
            assert dq.enqueue("q", b"x") == 7
            assert dq.enqueue("q", b"y") == 7
            assert dq.transport.leader == leader.url  # type: ignore[attr-defined]
            assert dq.transport.urls == [follower.url, leader.url]  # type: ignore[attr-defined]
        assert len(follower.seen) == 1  # the second call went to the leader at once
        assert [json.loads(b)["items"][0]["value"] for _, _, b in leader.seen] == ["x", "y"]
        assert leader.seen[0][:2] == ("POST", "/v1/queues/q/items")


def test_a_dead_first_url_is_skipped_at_once() -> None:
    with scripted(ENQUEUED) as leader, Client([dead_url(), leader.url], retries=0) as dq:
        t0 = time.monotonic()
        assert dq.enqueue("q", b"x") == 7
        assert time.monotonic() - t0 < 2.0  # no pause: another URL was known
        assert dq.transport.leader == leader.url  # type: ignore[attr-defined]


def test_a_follower_without_a_leader_gives_way_to_the_next_url() -> None:
    with scripted(NO_LEADER) as follower, scripted(ENQUEUED) as leader:
        with Client(f"{follower.url},{leader.url}") as dq:
            assert dq.enqueue("q", b"x") == 7
        assert len(follower.seen) == 1 and len(leader.seen) == 1


def test_a_stale_redirect_does_not_hide_the_nodes_not_asked_yet() -> None:
    # the old leader, cut off from etcd, knows no leader; a follower cut off as well
    # still names it; the third node leads: the call must reach it
    with scripted(NO_LEADER) as old, scripted(ENQUEUED) as leader:
        with (
            scripted(not_leader(old.url)) as stale,
            Client([old.url, stale.url, leader.url], retries=1, failover_s=2.0) as dq,
        ):
            assert dq.enqueue("q", b"x") == 7
            assert dq.transport.leader == leader.url  # type: ignore[attr-defined]
        assert len(old.seen) == 1 and len(stale.seen) == 1 and len(leader.seen) == 1


def test_a_redirect_loop_ends_with_a_clear_error() -> None:
    with scripted(not_leader(None)) as a, scripted(not_leader(a.url)) as b:
        a.script[:] = [not_leader(b.url)]
        with Client(a.url, retries=1, failover_s=0.4) as dq:
            t0 = time.monotonic()
            with pytest.raises(NotLeaderError) as err:
                dq.enqueue("q", b"x")
            took = time.monotonic() - t0
    assert took < 5.0
    assert err.value.status == 421 and err.value.code == "not_leader"
    assert err.value.leader in (a.url, b.url)
    message = str(err.value)
    assert f"{a.url} named {b.url}" in message and f"{b.url} named {a.url}" in message
    assert len(a.seen) >= 2 and len(b.seen) >= 2  # several rounds, then the error


def test_no_leader_everywhere_ends_as_the_servers_own_answer() -> None:
    with (
        scripted(NO_LEADER) as a,
        scripted(NO_LEADER) as b,
        Client([a.url, b.url], retries=1, failover_s=0.3) as dq,
        pytest.raises(Unavailable) as err,
    ):
        dq.enqueue("q", b"x")
    assert err.value.code == "no_leader" and err.value.status == 503


def test_every_url_dead_is_a_transport_error_naming_them() -> None:
    urls = [dead_url(), dead_url()]
    with Client(urls, retries=1, failover_s=0.3) as dq, pytest.raises(TransportError) as err:
        dq.health()
    assert all(u in str(err.value) for u in urls)


def test_a_redirect_to_a_dead_leader_tries_the_other_nodes() -> None:
    """Just after a leader dies a follower may still name it."""
    gone = dead_url()
    with scripted(not_leader(gone)) as stale, scripted(ENQUEUED) as new_leader:
        with Client([stale.url, new_leader.url], retries=0) as dq:
            assert dq.enqueue("q", b"x") == 7
        assert len(stale.seen) == 1 and len(new_leader.seen) == 1


def test_the_async_client_follows_the_same_way() -> None:
    async def run(leader: ScriptedServer, follower: ScriptedServer) -> None:
        async with AsyncClient([dead_url(), follower.url], retries=0) as dq:
            assert await dq.enqueue("q", b"x") == 7
            assert await dq.enqueue("q", b"y") == 7
        async with AsyncClient(follower.url, retries=1, failover_s=0.3) as dq:
            follower.script[:] = [not_leader(follower.url)]  # names itself: a loop
            with pytest.raises(NotLeaderError):
                await dq.enqueue("q", b"z")

    with scripted(ENQUEUED) as leader, scripted(not_leader(leader.url)) as follower:
        asyncio.run(run(leader, follower))
        assert len(leader.seen) == 2


def test_a_new_client_of_the_same_nodes_starts_at_the_last_leader() -> None:
    with scripted(ENQUEUED) as leader, scripted(not_leader(leader.url)) as follower:
        urls = [follower.url, leader.url]
        with Client(urls) as dq:
            dq.enqueue("q", b"x")
        with Client(",".join(urls)) as dq:  # the same nodes, written another way
            assert dq.transport.leader == leader.url  # type: ignore[attr-defined]
            dq.enqueue("q", b"y")
        assert len(follower.seen) == 1 and len(leader.seen) == 2
        with Client(follower.url) as dq:  # one URL: that server first, as always
            assert dq.transport.leader == follower.url  # type: ignore[attr-defined]


def test_refusals_after_a_lost_answer_end_as_an_unknown_outcome() -> None:
    """A keyed enqueue whose first answer was lost (the node may have written it) and
    whose retries only met refusals must not end with NotLeaderError ("not carried
    out"): its outcome is unknown, a TransportError that says so."""
    with scripted(not_leader(None)) as a, scripted(not_leader(a.url)) as b:
        a.script[:] = [DROP, not_leader(b.url)]
        with (
            Client(a.url, retries=1, failover_s=0.4) as dq,
            pytest.raises(TransportError, match="outcome unknown") as err,
        ):
            dq.enqueue("q", b"x", key="k")
    assert not isinstance(err.value, NotLeaderError)
    assert a.url in str(err.value)
    with (
        scripted(DROP, NO_LEADER) as lone,
        Client(lone.url, retries=1) as dq,
        pytest.raises(TransportError, match="outcome unknown"),
    ):
        dq.enqueue("q", b"x", key="k")


# A stalled leader (SIGSTOP, a frozen VM): its kernel takes the connection and the
# request, nothing answers. ``stalled`` scripted nodes do the same.

ENQUEUED_8 = Answer(200, {"items": [{"id": 8, "deadline": 1}]})


def view(role: str, leader: str | None) -> dict[str, object]:
    """A ``GET /v1/cluster`` answer."""
    return {"node": "n", "role": role, "leader": None if leader is None else {"url": leader}}


def elect(new: ScriptedServer, followers: list[ScriptedServer]) -> None:
    new.script[:] = [ENQUEUED_8]
    new.view = view("leader", new.url)
    for f in followers:
        f.script[:] = [not_leader(new.url)]
        f.view = view("follower", new.url)


def test_a_stalled_leader_costs_one_timeout_then_calls_go_to_the_new_one() -> None:
    with (
        scripted(ENQUEUED) as old,
        scripted(not_leader(None)) as new,
        scripted(not_leader(None)) as other,
    ):
        old.view = view("leader", old.url)
        for f in (new, other):
            f.script[:] = [not_leader(old.url)]
            f.view = view("follower", old.url)
        with Client([other.url, new.url, old.url], timeout=0.5, failover_s=5) as dq:
            # a new client asks who leads before its first call: other names old
            assert dq.enqueue("q", b"a") == 7
            assert (other.probes, old.probes, len(other.seen)) == (1, 1, 0)
            old.stalled = True
            elect(new, [other])
            t0 = time.monotonic()
            with pytest.raises(TransportError, match=r"no answer within 0\.5 s"):
                dq.enqueue("q", b"b")  # sent to old before the client could know
            assert time.monotonic() - t0 < 3.0
            t1 = time.monotonic()
            for n in range(20):  # none goes back to the stalled node
                assert dq.enqueue("q", f"c{n}".encode()) == 8
            assert time.monotonic() - t1 < 3.0
            assert dq.transport.leader == new.url  # type: ignore[attr-defined]
        assert len(old.seen) == 2 and old.probes == 1
        assert len(new.seen) == 20 and len(other.seen) == 1  # one 421, then the leader


def test_a_keyed_enqueue_that_timed_out_is_sent_again_to_the_new_leader() -> None:
    """A keyed enqueue may be resent (the server answers a repeated key with the first
    item): after its timeout at the stalled node it goes to the next one, not back."""
    with scripted(ENQUEUED) as old, scripted(not_leader(None)) as new:
        with Client([old.url, new.url], timeout=0.5) as dq:
            old.view = view("leader", old.url)
            assert dq.enqueue("q", b"a") == 7
            old.stalled = True
            elect(new, [])
            t0 = time.monotonic()
            assert dq.enqueue("q", b"b", key="k") == 8
            assert time.monotonic() - t0 < 3.0
        assert [json.loads(b)["items"][0]["key"] for _, _, b in new.seen] == ["k"]


def test_a_new_client_skips_a_stalled_first_url_after_a_short_probe() -> None:
    """As the CLI does, each run a new process: the first node is asked who leads (2 s
    at most, the call's timeout if shorter) and the call never goes to a stalled one."""
    with (
        scripted(ENQUEUED) as old,
        scripted(not_leader(None)) as new,
        scripted(not_leader(None)) as other,
    ):
        old.stalled = True
        elect(new, [other])
        t0 = time.monotonic()
        with Client([old.url, other.url, new.url], timeout=30) as dq:
            assert dq.enqueue("q", b"x") == 8
        assert time.monotonic() - t0 < 10.0  # the probe's 2 s, not the call's 30 s
        assert old.seen == [] and other.seen == [] and new.probes == 1


def test_the_async_client_leaves_a_stalled_leader_too() -> None:
    async def run(old: ScriptedServer, new: ScriptedServer) -> float:
        async with AsyncClient([old.url, new.url], timeout=0.5, retries=0) as dq:
            assert await dq.enqueue("q", b"a") == 7
            old.stalled = True
            elect(new, [])
            with pytest.raises(TransportError, match="no answer"):
                await dq.enqueue("q", b"b")
            t0 = time.monotonic()
            got = [await dq.enqueue("q", b"c") for _ in range(5)]
            assert got == [8] * 5
            return time.monotonic() - t0

    with scripted(ENQUEUED) as old, scripted(not_leader(None)) as new:
        old.view = view("leader", old.url)
        assert asyncio.run(run(old, new)) < 3.0
        assert len(old.seen) == 2 and len(new.seen) == 5


def test_the_consumer_group_client_leaves_a_stalled_leader() -> None:
    """The Spark source's client: every call of its protocol may be repeated, so the
    call that timed out at the stalled node is itself carried on at the new leader."""
    from dq.client.groups import ConsumerClient

    info = {
        "queue": "q", "consumer": "c", "epoch": "e", "next_seq": 0, "first_unacked": 0,
        "in_flight": 0, "bytes": 0, "lease_ms": 1000, "idle_timeout_ms": 1000, "lost": 0,
    }  # fmt: skip
    with scripted(Answer(200, info)) as old, scripted(not_leader(None)) as new:
        old.view = view("leader", old.url)
        with ConsumerClient(f"{old.url},{new.url}", "q", "c", timeout=0.5) as consumer:
            assert consumer.info() is not None
            old.stalled = True
            new.script[:] = [Answer(200, {**info, "epoch": "new"})]
            new.view = view("leader", new.url)
            t0 = time.monotonic()
            got = consumer.info()
            assert got is not None and got.epoch == "new"
            assert time.monotonic() - t0 < 3.0
        assert len(old.seen) == 2 and len(new.seen) == 1
