"""Delivery rules through a replica group's failovers, driven as users drive them: one
etcd and three ``dq serve`` on 127.0.0.1 (the cluster of ``cluster.py``), a queue
with ``group_limit`` 1 and ``leased_limit`` 3 and grouped items, consumers on ``Client``
given every member's URL (it follows the leader). The leader is first frozen
(``SIGSTOP``) and a dequeue waits in its connection while a new leader is elected; then
the new leader is SIGKILLed mid-stream (``docs/delivery.md``, "Failover").

What must hold (``docs/replication.md``, "Leases and failover"): the rules and the
items' groups are on every member and rule the new leader; a leader's leases end with
its term, as a restart ends them (nothing is leased on the new leader: the items they
held are delivered again at once, first in their groups, and their receipts are
stale); a leader whose term is over hands out nothing, even to a request that was
waiting in its connection while it was frozen; and, with each term's leases ending at
its end, no instant had more than one item of a group, or three in all, leased. Every
item is released in the end, and each group's items were first delivered in order.

Each consumer notes which member answered each dequeue and when (``Client.leader``
after the call), and holds an item from that answer until it sends the release: the
server's lease spans at least that.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from dq.client import Client, ClientError, Item, NewItem, QueueConfig, RateLimit, RetryPolicy
from tests.replication.cluster import Cluster, eventually, leader_other_than
from tests.server.overlaps import most_at_once
from tests.stopped import sigstop

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Q = "orders"
GROUPS = 6
ITEMS = 72
CONFIG = QueueConfig(
    group_limit=1,
    leased_limit=3,
    rate_limit=RateLimit(per_second=1000, burst=100, per_group=False),
)
#: a consumer's lease: far longer than the test, so only a failover ends one
LEASE_MS = 120_000
#: how late after a signal a consumer may note an answer received before it (a loaded
#: machine can hold a thread between the answer and its clock reading)
SLACK_S = 0.5


@dataclass(frozen=True, slots=True)
class Held:
    """One delivery as its consumer saw it."""

    node: str  # the member that answered the dequeue
    start: float  # when the answer was in hand (time.time())
    end: float  # just before the release was sent
    id: int
    group: str | None
    released: bool


class Consumers:
    """Three consumer threads taking and releasing items until told to stop; they can
    be paused (each releases what it holds and then waits)."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = urls
        self.lock = threading.Lock()
        self.held: list[Held] = []
        self.released: set[int] = set()
        self.errors: list[str] = []
        self.go = threading.Event()
        self.go.set()
        self.idle = [threading.Event() for _ in range(3)]
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(n,)) for n in range(3)]

    def start(self) -> Consumers:
        for t in self.threads:
            t.start()
        return self

    def count(self) -> int:
        with self.lock:
            return len(self.released)

    def pause(self) -> None:
        for e in self.idle:
            e.clear()
        self.go.clear()
        for e in self.idle:
            assert e.wait(30), "a consumer did not come to rest"

    def finish(self) -> None:
        self.stop.set()
        self.go.set()
        for t in self.threads:
            t.join(60)
        assert not any(t.is_alive() for t in self.threads)

    def _run(self, n: int) -> None:
        rng = random.Random(n)
        give_up = time.monotonic() + 150
        with Client(self.urls, timeout=3.0, failover_s=30) as c:
            while not self.stop.is_set() and time.monotonic() < give_up:
                if not self.go.is_set():
                    self.idle[n].set()
                    self.go.wait(1)
                    continue
                try:
                    got = c.dequeue(Q, count=1, lease_ms=LEASE_MS, wait_ms=200)
                except ClientError as exc:  # a failover under way: try again
                    with self.lock:
                        self.errors.append(f"dequeue: {exc!r}")
                    continue
                node, start = c.transport.leader, time.time()  # type: ignore[attr-defined]
                time.sleep(rng.uniform(0.03, 0.12))  # the work
                for item in got:
                    end = time.time()
                    try:
                        ok = c.release_many(Q, [item])[0].ok
                    except ClientError as exc:  # lost with a leader: unknown
                        ok = False
                        with self.lock:
                            self.errors.append(f"release: {exc!r}")
                    with self.lock:
                        self.held.append(Held(node, start, end, item.id, item.group, ok))
                        if ok:
                            self.released.add(item.id)


def _config_on(url: str) -> QueueConfig | None:
    with Client(url, timeout=5.0) as c:
        return c.queue(Q).config


def test_limits_hold_through_a_frozen_and_a_killed_leader(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    urls = [s.url for s in group.servers.values()]
    names = [f"customer-{(n // 2) % GROUPS}" for n in range(ITEMS)]  # runs of two
    with Client(first.url, timeout=10.0) as dq:
        dq.put_queue(Q, CONFIG)
        ids = [
            e.id
            for e in dq.enqueue_many(Q, [NewItem(b"%d" % n, group=g) for n, g in enumerate(names)])
        ]
        # held across the first failover: customer-0 gets nothing more from this leader
        [kept] = dq.dequeue(Q, 1, lease_ms=LEASE_MS)
    group_of = dict(zip(ids, names, strict=True))
    assert kept.id == ids[0] and kept.group == "customer-0"
    kept_at = time.time()

    # the rules and the groups are on every member, which serve them from their copy
    for name, server in group.servers.items():
        eventually(
            f"{name}: the queue's rules", lambda s=server: _config_on(s.url) == CONFIG or None
        )  # type: ignore[misc]
        with Client(server.url, timeout=5.0) as c:
            assert c.peek(Q, ids[-1], values=False).group == names[-1]

    consumers = Consumers(urls).start()
    try:
        eventually("releases at the first leader", lambda: consumers.count() >= 12 or None)
        consumers.pause()

        # freeze the leader, with a consumer's connection open to it
        frozen = group.servers[first.node]
        assert frozen.proc is not None
        late = httpx.Client(base_url=first.url, timeout=30)
        late.get("/v1/cluster").raise_for_status()  # the connection is open
        frozen_at = time.time()
        sigstop(frozen.proc.pid)
        try:
            second = eventually(
                "a leader while the first is frozen", leader_other_than(group, first.node)
            )
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(
                    late.post, f"/v1/queues/{Q}/dequeue", json={"count": 3, "lease_ms": LEASE_MS}
                )
                time.sleep(0.3)  # the request waits in the frozen process's socket
                frozen.proc.send_signal(signal.SIGCONT)
                answer = waiting.result(timeout=30)
            answered_at = time.time()
        finally:
            frozen.proc.send_signal(signal.SIGCONT)
            late.close()
        stale = answer.json().get("items", []) if answer.status_code == 200 else []
        late_held = [
            Held(first.url, answered_at, answered_at + 2.0, i["id"], i.get("group"), False)
            for i in stale
        ]

        # the new leader: nothing leased, the kept item's receipt is stale and the item
        # comes again at once, first of its group
        with Client(second.url, timeout=10.0) as dq:
            eventually("the new leader serving", lambda: dq.queue(Q).config == CONFIG or None)
            assert dq.queue(Q).stats.leased == 0
            [outcome] = dq.release_many(Q, [kept])
            assert (outcome.ok, outcome.error) == (False, "stale_receipt"), outcome
        consumers.go.set()
        eventually(
            "releases at the second leader", lambda: consumers.count() >= 30 or None, timeout=60
        )
        eventually("the first leader back in sync", lambda: group.in_sync(3), timeout=60)
        # it rejoined with a copy of the second leader's queues: the rules and the
        # groups came with it (either survivor may lead next)
        assert _config_on(first.url) == CONFIG
        with Client(first.url, timeout=5.0) as c:
            assert c.peek(Q, ids[-1], values=False).group == names[-1]
        killed_at = time.time()
        group.servers[second.node].kill()
        third = eventually("a leader after the kill", leader_other_than(group, second.node))

        def all_done() -> bool | None:
            with Client(third.url, timeout=5.0) as c:
                left = [i for i in ids if i not in consumers.released]
                return all(c.peek(Q, i, values=False).state == "gone" for i in left) or None

        eventually("every item released at the third leader", all_done, timeout=90)
    finally:
        consumers.finish()

    assert answer.status_code in (421, 503) and not stale, (answer.status_code, answer.text)
    kept_held = Held(first.url, kept_at, frozen_at, kept.id, kept.group, False)
    held = [kept_held, *consumers.held, *late_held]
    assert all(h.group == group_of[h.id] for h in held)  # every leader knew the groups

    # each leader's term: its member's answers between its start and its end, and its
    # leases end with it
    terms = [
        (first.url, 0.0, frozen_at),
        (second.url, frozen_at, killed_at),
        (third.url, killed_at, float("inf")),
    ]
    by_term: list[list[Held]] = [[] for _ in terms]
    outside = []
    for h in held:
        for n, (url, begin, end) in enumerate(terms):
            if h.node == url and begin <= h.start <= end + SLACK_S:
                by_term[n].append(Held(h.node, h.start, min(h.end, end), h.id, h.group, h.released))
                break
        else:
            outside.append(h)
    assert not outside, f"deliveries by a member outside its term as leader: {outside}"
    per_group, most = most_at_once((h.start, h.end, h.group) for term in by_term for h in term)
    assert max(per_group.values()) == 1 and most <= 3, (per_group, most)
    assert all(by_term), "each leader delivered"
    # the kept item came again first of its group at the second leader
    again = [h.id for h in sorted(by_term[1], key=lambda h: h.start) if h.group == "customer-0"]
    assert again[:1] == [kept.id], again

    # nothing lost, each group first delivered in its order and, within a term, in order
    first_seen: dict[int, float] = {}
    for h in sorted(held, key=lambda h: h.start):
        first_seen.setdefault(h.id, h.start)
    assert set(first_seen) == set(ids), "an item was never delivered"
    for g in set(names):
        mine = [i for i in ids if group_of[i] == g]
        assert sorted(mine, key=lambda i: first_seen[i]) == mine, g
        for term in by_term:
            seen = [h.id for h in sorted(term, key=lambda h: h.start) if h.group == g]
            assert seen == sorted(seen), (g, seen)
    with Client(third.url, timeout=10.0) as dq:
        assert dq.queue(Q).stats.leased == 0
    print(f"{len(held)} deliveries; retried calls during the failovers: {len(consumers.errors)}")


def test_an_expired_lease_comes_back_first_of_its_group_at_the_next_leader(
    group: Cluster,
) -> None:
    """With ``group_limit`` 1 and a 3 s retry delay, a1's lease runs out at the leader,
    which writes a1 back later than a2: its group waits for it. The leader is SIGKILLed
    and the member that takes over hands out a1 before a2, as the leader would have
    (``docs/delivery.md``, "An expired lease's place")."""
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    queue = "ordered"
    with Client(first.url, timeout=10.0) as dq:
        dq.put_queue(queue, QueueConfig(group_limit=1, retry=RetryPolicy(delays_ms=[3000])))
        a1, a2 = dq.enqueue_many(queue, [NewItem(b"a1", group="a"), NewItem(b"a2", group="a")])
        [got] = dq.dequeue(queue, 1, lease_ms=100)
        assert got.id == a1.id

    def written_back(url: str) -> bool | None:
        with Client(url, timeout=5.0) as c:
            return c.peek(queue, a1.id, values=False).last_error == "lease expired" or None

    for server in group.servers.values():  # on every member
        eventually("a1 written back", lambda s=server: written_back(s.url))  # type: ignore[misc]
    group.servers[first.node].kill()
    second = eventually("a leader after the kill", leader_other_than(group, first.node))
    with Client(second.url, timeout=10.0) as dq:
        eventually("the new leader serving", lambda: dq.queue(queue).config.group_limit or None)
        given: list[Item] = []
        give_up = time.monotonic() + 30
        while not given:  # a2 waits for a1 until its retry is due
            assert time.monotonic() < give_up
            given = dq.dequeue(queue, 2, lease_ms=60_000, wait_ms=1000)
        assert [i.id for i in given] == [a1.id]
        assert dq.release_many(queue, given)[0].ok
        assert [i.id for i in dq.dequeue(queue, 2, lease_ms=60_000, wait_ms=1000)] == [a2.id]
