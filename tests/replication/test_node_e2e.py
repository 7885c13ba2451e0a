"""Three ``dq serve`` processes and one etcd on 127.0.0.1: the leader is SIGKILLed, a
sync member takes over, every acknowledged enqueue is delivered by the new leader, and
the killed node rejoins as a follower after a restart."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dq.client import Client
from tests.replication.cluster import QUEUE, Cluster, eventually, leader_other_than
from tests.stopped import sigstop

pytestmark = pytest.mark.timeout(180)


def enqueue_all(url: str, values: list[bytes], acked: set[bytes]) -> None:
    """Enqueue in batches of 10; a batch that got an answer is acknowledged."""
    with Client(url) as client:
        for start in range(0, len(values), 10):
            batch = values[start : start + 10]
            client.enqueue_many(QUEUE, batch)
            acked.update(batch)


def drain(url: str, expected: set[bytes], timeout: float = 30.0) -> set[bytes]:
    delivered: set[bytes] = set()
    give_up = time.monotonic() + timeout
    with Client(url) as client:
        while not expected <= delivered and time.monotonic() < give_up:
            items = client.dequeue(QUEUE, count=100, lease_ms=60_000, wait_ms=200)
            for item in items:
                delivered.add(item.value)
                client.release(QUEUE, item.id, item.receipt)
    return delivered


def test_leader_killed_a_sync_member_takes_over_nothing_acknowledged_is_lost(
    group: Cluster,
) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    acked: set[bytes] = set()
    enqueue_all(first.url, [f"before-{i}".encode() for i in range(200)], acked)
    assert len(acked) == 200
    # the followers hold the acknowledged items: their lsn reached the commit
    assert group.describe(first.node)["role"] == "leader"

    group.servers[first.node].kill()
    killed_at = time.monotonic()
    successor = eventually(
        "a new leader",
        lambda: v.leader if (v := group.view()).leader and v.leader.node != first.node else None,
    )
    assert successor.epoch > first.epoch

    def write_once() -> bool | None:
        with Client(successor.url) as client:
            client.enqueue(QUEUE, b"after-0")
        acked.add(b"after-0")
        return True

    eventually("writes accepted by the new leader", write_once)
    failover_s = time.monotonic() - killed_at
    print(f"leader SIGKILLed: writes accepted again after {failover_s:.2f} s")
    enqueue_all(successor.url, [f"after-{i}".encode() for i in range(1, 50)], acked)

    delivered = drain(successor.url, acked)
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged items lost, e.g. {sorted(missing)[:5]}"
    phantom = {v for v in delivered if not v.startswith((b"before-", b"after-"))}
    assert not phantom
    assert failover_s < 20, f"failover took {failover_s:.1f} s"

    # the killed node comes back as a follower of the new epoch and rejoins the sync set
    group.servers[first.node].start(90)

    def rejoined() -> bool | None:
        doc = group.describe(first.node)
        if doc["role"] != "follower" or doc["epoch"] != successor.epoch:
            return None
        current = group.view()
        sync = current.sync
        return True if sync is not None and first.node in sync.members else None

    eventually("the killed node following the new leader, in sync", rejoined, timeout=60)
    refused = httpx.post(
        group.servers[first.node].url + f"/v1/queues/{QUEUE}/items",
        json={"items": [{"value": "to-a-follower"}]},
        timeout=5,
    )
    assert refused.status_code == 421, refused.text  # a follower sends writers away
    assert refused.headers["X-DQ-Leader"] == successor.url
    # a client given every member finds the leader by itself
    everyone = ",".join(s.url for s in group.servers.values())
    late: set[bytes] = set()
    enqueue_all(everyone, [f"any-{i}".encode() for i in range(20)], late)
    assert drain(everyone, late) == late


def test_graceful_handover_then_a_paused_leader_is_fenced(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    acked: set[bytes] = set()
    enqueue_all(first.url, [f"one-{i}".encode() for i in range(50)], acked)

    # SIGTERM: the leader resigns on its way out, so a sync member leads at once
    stopped_at = time.monotonic()
    assert group.servers[first.node].terminate(timeout=30) == 0
    second = eventually("a new leader after a graceful stop", leader_other_than(group, first.node))
    handover_s = time.monotonic() - stopped_at
    assert second.epoch > first.epoch
    eventually("the new leader with its follower in sync", lambda: group.in_sync(2), timeout=30)
    enqueue_all(second.url, [f"two-{i}".encode() for i in range(50)], acked)

    # SIGSTOP past the lease: another member leads; the paused one, resumed, must not
    # acknowledge a write it receives, and ends up following the new leader
    paused = group.servers[second.node]
    assert paused.proc is not None
    sigstop(paused.proc.pid)
    try:
        third = eventually(
            "a leader while the old one is paused", leader_other_than(group, second.node)
        )
        assert third.epoch > second.epoch
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(
                httpx.post,
                paused.url + f"/v1/queues/{QUEUE}/items",
                json={"items": [{"value": "sent-to-a-paused-leader"}]},
                timeout=20,
            )
            time.sleep(0.3)  # the request is waiting in the paused process's backlog
            paused.proc.send_signal(signal.SIGCONT)
            answer = late.result(timeout=30)
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    assert answer.status_code in (421, 503), answer.text

    def follows_third() -> bool | None:
        doc = group.describe(second.node)
        return True if doc["role"] == "follower" and doc["epoch"] == third.epoch else None

    eventually("the resumed leader following the new one", follows_third, timeout=60)
    eventually("writes on the newest leader", lambda: group.in_sync(2), timeout=30)
    enqueue_all(third.url, [f"three-{i}".encode() for i in range(50)], acked)
    delivered = drain(third.url, acked)
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged items lost, e.g. {sorted(missing)[:5]}"
    assert b"sent-to-a-paused-leader" not in delivered or answer.status_code == 503
    print(f"graceful handover {handover_s:.2f} s; paused leader answered {answer.status_code}")
