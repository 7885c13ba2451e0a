"""Keys and reasons in a replica group of three ``dq serve`` and one etcd on 127.0.0.1:
what a key names, a cancel and a replace by key, and an item's last error reach every
member with the records that wrote them, so after the leader is SIGKILLed the new
leader's keys name the same items (a cancelled timeout stays cancelled, a debounced
digest is one item with its newest value) and a failed item still says why."""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import httpx
import pytest

from dq.client import Client, KeyNotFound, QueueConfig, RetryPolicy
from tests.replication.cluster import Cluster, eventually, leader_other_than

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Q = "payments"


def key_on(url: str, key: str) -> dict[str, Any] | None:
    """The item ``key`` names as member ``url`` holds it (None: it names nothing)."""
    r = httpx.get(f"{url}/v1/queues/{Q}/keys/{key}", timeout=10)
    if r.status_code == 404:
        return None
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def test_keys_cancels_replaces_and_reasons_outlive_the_leader(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    with Client(first.url) as dq:
        dq.put_queue(Q, QueueConfig(dedup_window_ms=3_600_000, retry=RetryPolicy(delays_ms=(300,))))
        for n in range(1, 4):
            dq.enqueue(Q, f"expire order {n}".encode(), delay_ms=600_000, key=f"order-{n}")
        dq.cancel_key(Q, "order-2")  # paid
        dq.enqueue(Q, b"digest v1", delay_ms=600_000, key="digest", on_duplicate="replace")
        digest = dq.enqueue(Q, b"digest v2", delay_ms=600_000, key="digest", on_duplicate="replace")
        charge = dq.enqueue(Q, b"charge", key="charge-9")
        [item] = dq.dequeue(Q, wait_ms=2000)
        assert item.id == charge
        dq.fail(Q, item.id, item.receipt, "ConnectionError: card network down")

    # every member holds what the keys name (their copies answer reads). A member's copy
    # may be a little behind the leader (docs/replication.md, "The group"), so each is
    # waited for until it shows the digest's newest value; it applies records in the
    # leader's order, so by then it has applied the cancel written before it too
    def newest_digest(url: str) -> dict[str, Any] | None:
        doc = key_on(url, "digest")
        return doc if doc is not None and doc["value"] == "digest v2" else None

    for name, server in group.servers.items():
        doc = eventually(f"{name}: the digest's newest value", partial(newest_digest, server.url))
        assert doc["id"] == digest
        assert key_on(server.url, "order-2") is None, f"{name}: order-2 not cancelled"
        assert key_on(server.url, "order-1") is not None, f"{name}: order-1 lost"

    group.servers[first.node].kill()
    successor = eventually("a new leader", leader_other_than(group, first.node))
    with Client(successor.url) as dq:

        def on_successor() -> bool | None:
            return True if dq.peek_key(Q, "order-1").state == "delayed" else None

        eventually("the new leader serving", on_successor)
        with pytest.raises(KeyNotFound):
            dq.peek_key(Q, "order-2")  # the cancel holds
        assert dq.peek_key(Q, "digest").value == b"digest v2"
        assert dq.cancel_key(Q, "order-3") == dq.peek_key(Q, "order-1").id + 2
        moved = dq.patch_key(Q, "digest", delay_ms=0)
        assert moved.id == digest
        got: dict[bytes, Any] = {}
        give_up = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < give_up:
            for i in dq.dequeue(Q, count=10, wait_ms=500):
                got[i.value] = i
        assert set(got) == {b"digest v2", b"charge"}
        assert got[b"charge"].last_error == "ConnectionError: card network down"
        assert got[b"charge"].stats.dequeue_count == 2
