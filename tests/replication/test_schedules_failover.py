"""Schedules in a replica group of three ``dq serve`` and one etcd on 127.0.0.1: the
definitions reach every member, only the leader fires, and across a SIGKILLed leader and
then a leader paused past its lease (SIGSTOP: it wakes still believing it leads, and its
writes must not count) every tick is in the queue exactly once. The schedule fires into
a queue that keeps no idempotency keys, so only the progress written with each tick,
replicated with it, keeps the next leader from firing a tick again."""

from __future__ import annotations

import signal
import time
from typing import Any

import httpx
import pytest

from tests.replication.cluster import Cluster, eventually, leader_other_than
from tests.server.live import browse_all
from tests.stopped import sigstop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

Q = "ticks"
EVERY = 100


@pytest.fixture
def group_env() -> dict[str, str]:
    """Schedules as frequent as the test's: every 100 ms."""
    return {"DQ_SCHEDULE_MIN_EVERY_MS": str(EVERY)}


def ticks_on(url: str) -> list[int]:
    return [i["deadline"] for i in browse_all(url, Q)]


def schedule_on(url: str) -> dict[str, Any]:
    doc: dict[str, Any] = httpx.get(f"{url}/v1/queues/{Q}/schedules/beat", timeout=10).json()
    return doc


def test_failovers_fire_every_tick_once(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    r = httpx.put(f"{first.url}/v1/queues/{Q}", json={"dedup_window_ms": 0}, timeout=30)
    assert r.status_code == 200, r.text
    r = httpx.put(
        f"{first.url}/v1/queues/{Q}/schedules/beat",
        json={"every_ms": EVERY, "catch_up": "all"},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    followers = [n for n in group.servers if n != first.node]
    # the definition is on every member; a follower fires nothing and refuses changes
    for node in followers:
        url = group.servers[node].url
        doc = eventually("the definition on " + node, lambda u=url: schedule_on(u).get("every_ms"))
        assert doc == EVERY
        refused = httpx.post(f"{url}/v1/queues/{Q}/schedules/beat/pause", timeout=10)
        assert refused.status_code == 421, refused.text
    # replicated progress: the leader's ticks, as a follower's copy shows them
    on_follower = group.servers[followers[0]].url
    eventually("five ticks on a follower", lambda: schedule_on(on_follower)["fired"] >= 5 or None)

    group.servers[first.node].kill()
    second = eventually("a new leader", leader_other_than(group, first.node))
    eventually("the new leader with its follower in sync", lambda: group.in_sync(2), timeout=30)
    eventually(
        "ticks fired by the new leader",
        lambda: True if schedule_on(second.url)["lateness_ms"] is not None else None,
    )
    time.sleep(1.0)

    # paused past its lease: another member leads; the paused one wakes up still a
    # leader in its own eyes for a moment, and its scheduler may fire: the group must
    # never count those writes
    paused = group.servers[second.node]
    assert paused.proc is not None
    sigstop(paused.proc.pid)
    try:
        third = eventually(
            "a leader while the old one is paused", leader_other_than(group, second.node)
        )
    finally:
        paused.proc.send_signal(signal.SIGCONT)

    def follows_third() -> bool | None:
        doc = group.describe(second.node)
        return True if doc["role"] == "follower" and doc["epoch"] == third.epoch else None

    eventually("the resumed leader following the new one", follows_third, timeout=60)
    eventually("writes on the newest leader", lambda: group.in_sync(2), timeout=30)
    time.sleep(1.0)
    stop_at = schedule_on(third.url)["last_tick"]
    assert stop_at is not None
    ticks = sorted(t for t in ticks_on(third.url) if t <= stop_at)
    assert len(ticks) == len(set(ticks)), "a tick twice"
    assert ticks == list(range(ticks[0], ticks[-1] + 1, EVERY)), "a tick lost"
    assert len(ticks) >= 30
    # the follower that was paused has the same ticks, none of its own
    on_second = sorted(t for t in ticks_on(paused.url) if t <= stop_at)
    assert on_second == ticks or set(on_second) <= set(ticks)
