"""The routing decisions of ``client/_routing.py`` alone (sans-IO): which node each try
goes to, when a node is asked who leads before it gets a call, and how a node whose
answer was lost is left until it answers again — the stalled leader (``SIGSTOP``, a
frozen VM) whose kernel still accepts requests that nothing will answer."""

from __future__ import annotations

import itertools

import pytest

from dq.client._routing import PROBE_TIMEOUT_S, Cluster, Endpoint, RetryPolicy, Walk

_ports = itertools.count(20_001)
POLICY = RetryPolicy(retries=3, base_s=0.05)


def nodes(n: int = 3) -> list[str]:
    """URLs no other test uses (the process remembers what it learnt per URL list)."""
    return [f"http://n{i}.test:{next(_ports)}" for i in range(1, n + 1)]


def cluster(urls: list[str]) -> Cluster:
    return Cluster(urls, None, None)


def walk(c: Cluster, failover_s: float = 10.0) -> Walk:
    return Walk(c, POLICY, failover_s)


def at(w: Walk) -> str:
    return w.endpoint.url


def lead(c: Cluster, url: str) -> None:
    """``url`` served a call (as after the walk below): it is the confirmed leader."""
    ep = c.named(url)
    assert ep is not None
    c.answered_by(ep)


def test_one_url_is_always_sent_the_call() -> None:
    [url] = nodes(1)
    w = walk(cluster([url]))
    assert at(w) == url and not w.probing


def test_a_new_client_of_several_nodes_asks_the_first_who_leads() -> None:
    a, b, c = nodes()
    w = walk(cluster([a, b, c]))
    assert at(w) == a and w.probing
    # a follower's view names the leader: asked in turn, as it has not answered yet
    assert w.probed("follower", c) == 0.0
    assert at(w) == c and w.probing
    assert w.probed("leader", c) == 0.0
    assert at(w) == c and not w.probing  # the call goes there now
    w.answered()
    assert w.cluster.leader.url == c and w.cluster.leader.confirmed


def test_a_node_without_a_cluster_view_gets_the_call() -> None:
    """A dq without replication, an older dq, a proxy: its own answer to the call decides."""
    a, b = nodes(2)
    for role in (None, "single"):
        w = walk(cluster([a, b]))
        assert w.probed(role, None) == 0.0
        assert at(w) == a and not w.probing


def test_a_node_that_knows_no_leader_gives_way_to_the_next() -> None:
    a, b, c = nodes()
    w = walk(cluster([a, b, c]))
    assert w.probed("candidate", None) == 0.0
    assert at(w) == b and w.probing
    assert w.probed("follower", None) == 0.0  # a follower between leaders
    assert at(w) == c and w.probing


def test_a_lost_answer_moves_the_next_calls_to_another_node() -> None:
    a, b, c = nodes()
    cl = cluster([a, b, c])
    lead(cl, b)
    first = walk(cl)
    assert at(first) == b and not first.probing  # confirmed: no probe, the call goes
    # the leader stalls: the call times out; an enqueue without a key is not resent
    assert first.lost_answer("no answer within 5 s", retry=False) is None
    assert first.lost is not None and b in first.lost
    assert cl.leader.url == c and not cl.endpoints[1].confirmed
    # the next call asks c; c names the new leader, a; a is asked and leads
    second = walk(cl)
    assert at(second) == c and second.probing
    assert second.probed("follower", a) == 0.0
    assert at(second) == a and second.probing
    assert second.probed("leader", a) == 0.0 and not second.probing
    second.answered()
    assert cl.leader.url == a
    assert walk(cl).probing is False  # later calls go to a at once


def test_a_retried_call_goes_to_the_next_node_not_back_to_the_stalled_one() -> None:
    a, b, c = nodes()
    cl = cluster([a, b, c])
    lead(cl, a)
    w = walk(cl)
    assert w.lost_answer("no answer within 5 s", retry=True) == 0.0
    assert at(w) == b and w.probing


def test_a_stalled_node_named_by_a_follower_is_only_asked_never_sent_the_call() -> None:
    """Before the election a follower still names the stalled leader: the client asks it
    who leads (a short timeout), not the call (the call's timeout), and moves on."""
    a, b, c = nodes()
    cl = cluster([a, b, c])
    lead(cl, a)
    assert walk(cl).lost_answer("no answer within 5 s", retry=False) is None
    w = walk(cl)
    assert at(w) == b
    assert w.probed("follower", a) == 0.0  # b still names a
    assert at(w) == a and w.probing
    assert w.probe_timeout(30.0) == PROBE_TIMEOUT_S
    assert w.probe_timeout(0.5) == 0.5
    assert w.probe_lost("no answer within 2 s") == 0.0
    assert at(w) == c and w.probing
    assert w.probed("follower", a) == POLICY.delay_s(1)  # c names a too: the round is over
    # a new round: after the policy's pause, from the last node named, asked again
    assert at(w) == a and w.probing and w.attempt == 1
    assert w.probe_timeout(30.0) == 2 * PROBE_TIMEOUT_S


def test_a_woken_old_leader_gets_no_call_until_it_leads() -> None:
    a, b, c = nodes()
    cl = cluster([a, b, c])
    lead(cl, a)
    walk(cl).lost_answer("no answer within 5 s", retry=False)
    lead(cl, b)  # the new leader served calls
    # a follower that has not caught up names a again; a, woken, answers as a follower
    cl.leader = cl.endpoints[2]
    w = walk(cl)
    assert at(w) == c
    w.probed("follower", a)
    assert at(w) == a and w.probing
    assert w.probed("follower", b) == 0.0
    assert at(w) == b and not w.probing  # b answered before: the call goes to b
    # an answer to a probe is enough to be sent calls again later
    assert cl.endpoints[0].confirmed


def test_a_new_client_in_the_same_process_starts_away_from_a_stalled_node() -> None:
    a, b, c = nodes()
    cl = cluster([a, b, c])
    lead(cl, a)
    assert walk(cluster([a, b, c])).probing is False  # the leader is remembered
    walk(cl).lost_answer("no answer within 5 s", retry=False)
    fresh = walk(cluster([a, b, c]))
    assert at(fresh) == b and fresh.probing  # not a: its last answer was lost
    lead(cl, c)
    again = walk(cluster([a, b, c]))
    assert at(again) == c and not again.probing


def test_an_unreachable_node_is_asked_before_it_gets_a_call_again() -> None:
    a, b = nodes(2)
    cl = cluster([a, b])
    lead(cl, a)
    w = walk(cl)
    assert w.unreachable("connection refused") == 0.0
    assert at(w) == b and w.probing
    assert not cl.endpoints[0].confirmed and cl.leader.url == b


def test_with_one_url_a_lost_answer_is_retried_there_as_before() -> None:
    [url] = nodes(1)
    cl = cluster([url])
    w = walk(cl)
    assert w.lost_answer("no answer within 5 s", retry=True) == POLICY.delay_s(1)
    assert at(w) == url and not w.probing and cl.leader.confirmed
    for _ in range(POLICY.retries - 1):
        assert w.lost_answer("no answer", retry=True) is not None
    assert w.lost_answer("no answer", retry=True) is None


def test_a_redirect_to_a_node_not_heard_from_asks_it_first() -> None:
    [url] = nodes(1)
    cl = cluster([url])
    w = walk(cl)
    leader = f"http://leader.test:{next(_ports)}"
    assert w.redirected(leader) == 0.0
    assert at(w) == leader and w.probing


def test_rounds_end_after_failover_s() -> None:
    a, b = nodes(2)
    w = walk(cluster([a, b]), failover_s=0.0)
    assert w.probe_lost("no answer") == 0.0
    pauses = []
    while (pause := w.probe_lost("no answer")) is not None:
        pauses.append(pause)
        assert len(pauses) < 50
    assert w.attempt > POLICY.retries
    assert "asked who leads" in w.story()


@pytest.mark.parametrize("url", ["ftp://x", "http://"])
def test_unusable_urls_are_refused(url: str) -> None:
    from dq.client.errors import TransportError

    with pytest.raises(TransportError):
        Endpoint(url, None, None)
