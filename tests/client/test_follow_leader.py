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
