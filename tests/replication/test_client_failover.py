"""A client given every node finds the leader and follows it across a failover, alone.

One etcd and three ``dq serve`` (the cluster of ``cluster.py``). The writer is
one ``Client`` built from the three URLs, never told which node leads: it starts on a
follower, is redirected, keeps enqueueing while the leader is SIGKILLed, and goes on at
the new leader by itself. Every acknowledged enqueue is then delivered — through a
client that again knows only the URLs.
"""

from __future__ import annotations

import threading
import time

import pytest

from dq.client import Client, ClientError
from tests.replication.cluster import QUEUE, Cluster, eventually

pytestmark = pytest.mark.timeout(180)


def test_a_client_with_every_url_rides_out_a_leader_kill(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    # followers first: the client has to be redirected before its first write
    urls = [s.url for n, s in group.servers.items() if n != first.node] + [first.url]
    acked: list[bytes] = []
    unknown: list[bytes] = []
    failed: list[str] = []
    killed_at: list[float] = []
    resumed_at: list[float] = []
    stop = threading.Event()

    def produce() -> None:
        with Client(urls, failover_s=30) as dq:
            n = 0
            while not stop.is_set():
                value = f"v{n}".encode()
                n += 1
                try:
                    dq.enqueue(QUEUE, value)
                except ClientError as exc:  # lost with the leader: outcome unknown
                    unknown.append(value)
                    failed.append(repr(exc))
                    continue
                acked.append(value)
                if killed_at and not resumed_at:
                    resumed_at.append(time.monotonic())

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        eventually("writes through the redirect", lambda: True if len(acked) >= 50 else None)
        group.servers[first.node].kill()
        killed_at.append(time.monotonic())
        eventually("writes at the new leader", lambda: True if resumed_at else None, timeout=60)
        count = len(acked)
        eventually("more writes", lambda: True if len(acked) >= count + 50 else None)
    finally:
        stop.set()
        writer.join(60)
    assert not writer.is_alive()
    outage = resumed_at[0] - killed_at[0]
    print(
        f"multi-URL client: first acknowledged write {outage:.2f} s after the kill; "
        f"{len(acked)} acknowledged, {len(unknown)} unknown"
    )
    assert len(unknown) <= 2, failed  # at most the request(s) in flight at the kill
    survivors = [s.url for n, s in group.servers.items() if n != first.node]
    delivered: set[bytes] = set()
    with Client(survivors) as dq:
        give_up = time.monotonic() + 60
        while not set(acked) <= delivered and time.monotonic() < give_up:
            for item in dq.dequeue(QUEUE, count=100, lease_ms=60_000, wait_ms=200):
                delivered.add(item.value)
                dq.release(QUEUE, item.id, item.receipt)
    missing = set(acked) - delivered
    assert not missing, f"{len(missing)} acknowledged enqueues lost, e.g. {sorted(missing)[:5]}"
    assert delivered <= set(acked) | set(unknown)
