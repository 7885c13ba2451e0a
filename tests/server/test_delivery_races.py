"""The delivery limits under races, the way users race for a queue: many consumers over
HTTP and over the ring at once, leases left to run out, a SIGKILL and a restart in the
middle (``docs/delivery.md``: a slot is a lease; after a restart nothing is leased).

Each consumer records when it certainly held each lease: from the moment its dequeue
answered to the moment before it sent the release (or a little before the lease's end,
for one it lets run out). The server's lease of an item spans at least that, so if the
records ever show more than ``group_limit`` items of a group, or ``leased_limit`` items
in all, held at one instant, the server had granted more than that. The ring's
deliveries do not name their group, so each consumer looks an item's group up by its id
(known from the enqueue). A rate limit is checked against the server's own grant times.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from dq.client import Client, Item, NewItem, QueueConfig, RateLimit, RetryPolicy
from tests.server.live import LiveServer, live_server
from tests.server.overlaps import most_at_once

pytestmark = pytest.mark.integration  # live dq serve processes, over HTTP and the ring

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "20", "DQ_MAX_WAIT_MS": "5000"}

#: (held from, held to, group, item id), times in seconds since the epoch
Interval = tuple[float, float, str, int]


def _race(
    urls: list[str],
    queue: str,
    group_of: dict[int, str],
    total: int,
    seed: int,
    lapse: float = 0.0,
    lease_ms: int = 5_000,
    until: Callable[[], bool] | None = None,
) -> tuple[list[Interval], set[int]]:
    """Consumers at ``urls`` take items of ``queue`` until every one of ``total`` was
    released (or ``until`` says stop); each holds an item a random few ms, and lets a
    ``lapse`` share of its leases run out instead of releasing them. The intervals held,
    and the ids released."""
    intervals: list[Interval] = []
    released: set[int] = set()
    lock = threading.Lock()
    stop = time.monotonic() + 90
    errors: list[BaseException] = []

    def consume(url: str, n: int) -> None:
        rng = random.Random(seed * 100 + n)
        try:
            with Client(url) as c:
                while time.monotonic() < stop and (until is None or not until()):
                    with lock:
                        if len(released) >= total:
                            return
                    got = c.dequeue(queue, rng.randint(1, 3), lease_ms=lease_ms, wait_ms=100)
                    held_from = time.time()
                    time.sleep(rng.random() * 0.004)
                    for item in got:
                        # the lease ends at its expiry at the latest (5 ms less for the
                        # clocks' whole milliseconds): an item left to run out is held
                        # until then, and a consumer held up past it (a busy machine)
                        # holds it no longer, whatever it does next
                        expires = item.lease_expires / 1000 - 0.005
                        if rng.random() < lapse:  # let it run out
                            with lock:
                                intervals.append((held_from, expires, group_of[item.id], item.id))
                            continue
                        held_to = min(time.time(), expires)  # before the release is sent
                        out = c.release_many(queue, [item])[0]
                        with lock:
                            intervals.append((held_from, held_to, group_of[item.id], item.id))
                            if out.ok:
                                released.add(item.id)
        except BaseException as exc:  # reported by the test, not lost in a thread
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(u, n)) for n, u in enumerate(urls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(100)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    return intervals, released


def _fill(dq: Client, queue: str, groups: int, items: int, run: int = 1) -> dict[int, str]:
    """``items`` items in ``groups`` groups, in runs of ``run`` items of one group (so a
    consumer that ignored the limits would take many of a group at once)."""
    names = [f"tenant-{(n // run) % groups}" for n in range(items)]
    enqueued = dq.enqueue_many(queue, [NewItem(b"%d" % n, group=g) for n, g in enumerate(names)])
    return {e.id: names[n] for n, e in enumerate(enqueued)}


@pytest.mark.parametrize("seed", [1, 2])
def test_many_consumers_never_exceed_the_limits(tmp_path: Path, seed: int) -> None:
    """Eight consumers, four over HTTP and four over the ring, race for a queue with
    group_limit 2 and leased_limit 6: no instant has more than 2 of a group or 6 in all
    leased, every item is released once, and the consumers did run side by side."""
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        dq.put_queue("race", QueueConfig(group_limit=2, leased_limit=6))
        group_of = _fill(dq, "race", 5, 300, run=10)
        urls = [server.url] * 4 + [f"shm://{server.data_dir}"] * 4
        intervals, released = _race(urls, "race", group_of, 300, seed)
        assert released == set(group_of)
        most_per_group, most = most_at_once((a, b, g) for a, b, g, _i in intervals)
        assert most <= 6 and max(most_per_group.values()) <= 2, (most, most_per_group)
        assert most >= 3  # the consumers did run side by side
        assert dq.queue("race").stats.leased == 0


def test_leases_running_out_free_their_slots_and_never_overfill(tmp_path: Path) -> None:
    """A third of the leases are left to run out (300 ms): each frees its slot when it
    ends, its item comes back and is delivered again, and no instant has more than
    group_limit (1) of a group leased — the item back from its lease first in its group."""
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        dq.put_queue("lapse", QueueConfig(group_limit=1))
        group_of = _fill(dq, "lapse", 4, 60, run=3)
        urls = [server.url] * 3 + [f"shm://{server.data_dir}"] * 3
        intervals, released = _race(urls, "lapse", group_of, 60, 7, lapse=0.3, lease_ms=300)
        assert released == set(group_of)
        most_per_group, _most = most_at_once((a, b, g) for a, b, g, _i in intervals)
        assert max(most_per_group.values()) == 1, most_per_group
        assert len(intervals) > 60  # leases did run out and their items came back
        # each group's items were first delivered in their order (FIFO per group)
        first: dict[int, float] = {}
        for a, _b, _g, i in sorted(intervals):
            first.setdefault(i, a)
        for g in set(group_of.values()):
            ids = sorted(i for i in group_of if group_of[i] == g)
            assert sorted(ids, key=lambda i: first[i]) == ids, g


def test_after_a_sigkill_nothing_is_leased_and_the_limits_hold(tmp_path: Path) -> None:
    """Consumers race (group_limit 1, leased_limit 3, two slots held by long leases)
    while the server is SIGKILLed and started again: after the restart every slot is
    free — a group whose item was leased before the kill delivers it again at once,
    first in its group — and neither before nor after does any instant have more than
    the limits leased."""
    server = LiveServer(tmp_path / "data", env=ENV).start()
    try:
        with Client(server.url) as dq:
            dq.put_queue("crash", QueueConfig(group_limit=1, leased_limit=3))
            group_of = _fill(dq, "crash", 6, 120, run=4)
            held = dq.dequeue("crash", 2, lease_ms=600_000)  # held across the kill
            held_from = time.time()
            assert len(held) == 2
            urls = [server.url] * 2 + [f"shm://{server.data_dir}"] * 2
            before, _released = _race(urls, "crash", group_of, 120, 3, until=_after(1.0))
            before += [(held_from, time.time(), group_of[i.id], i.id) for i in held]
            server.kill()
            server.start()
            assert dq.queue("crash").stats.leased == 0
            again = dq.dequeue("crash", 3, lease_ms=600_000)
            # their slots are free and each group's first item goes first: the two leased
            # at the kill were the first of their groups, so they come again at once
            assert {i.id for i in held} <= {i.id for i in again}, (held, again)
            dq.release_many("crash", again)
            left = {i for i in group_of if _exists(server, "crash", i)}
            after, released = _race(urls, "crash", group_of, len(left), 4)
            assert released == left
            for intervals in (before, after):
                most_per_group, most = most_at_once((a, b, g) for a, b, g, _i in intervals)
                assert most <= 3 and max(most_per_group.values(), default=0) <= 1
    finally:
        server.kill()


def _after(seconds: float) -> Callable[[], bool]:
    end = time.monotonic() + seconds
    return lambda: time.monotonic() >= end


def _exists(server: LiveServer, queue: str, item_id: int) -> bool:
    r = httpx.get(f"{server.url}/v1/queues/{queue}/items/{item_id}", timeout=10)
    r.raise_for_status()
    return bool(r.json()["state"] != "gone")


def test_racing_consumers_never_get_more_than_the_rate_allows(tmp_path: Path) -> None:
    """Six consumers over HTTP and the ring race for a queue limited to 40 deliveries a
    second with a burst of 5, for two seconds. Each lease's grant time is the server's
    own (its lease_expires less the lease asked for), so the check is exact: in no span
    of time did the queue hand out more than its bucket allows (burst + rate x span)."""
    lease_ms = 60_000
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        dq.put_queue("paced", QueueConfig(rate_limit=RateLimit(per_second=40, burst=5)))
        dq.enqueue_many("paced", [b"%d" % n for n in range(400)])
        granted: list[int] = []
        lock = threading.Lock()
        stop = time.monotonic() + 2.0

        def consume(url: str) -> None:
            with Client(url) as c:
                while time.monotonic() < stop:
                    got = c.dequeue("paced", 3, lease_ms=lease_ms, wait_ms=100)
                    with lock:
                        granted.extend(i.lease_expires - lease_ms for i in got)

        urls = [server.url] * 3 + [f"shm://{server.data_dir}"] * 3
        threads = [threading.Thread(target=consume, args=(u,)) for u in urls]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        granted.sort()
        assert len(granted) >= 50  # the consumers were served all along
        for i, start in enumerate(granted):
            for j in range(i, len(granted)):
                span_ms = granted[j] - start
                # a token per 25 ms; the clock's whole milliseconds allow one more
                assert j - i + 1 <= 5 + span_ms * 40 / 1000 + 1, (i, j, span_ms)
        assert dq.queue("paced").stats.rate_limited >= 1


def test_an_expired_lease_comes_back_first_of_its_group_after_a_sigkill(tmp_path: Path) -> None:
    """With ``group_limit`` 1 and a 2 s retry delay, a1's lease runs out and a1 is
    written back 2 s later than a2: its group waits for it (``docs/delivery.md``, "An
    expired lease's place"), and so it does after the server is SIGKILLed and started
    again: a2 is not handed out before a1."""
    server = LiveServer(tmp_path / "data", env=ENV).start()
    try:
        with Client(server.url) as dq:
            dq.put_queue("order", QueueConfig(group_limit=1, retry=RetryPolicy(delays_ms=[2000])))
            a1, a2 = dq.enqueue_many(
                "order", [NewItem(b"a1", group="a"), NewItem(b"a2", group="a")]
            )
            (first,) = dq.dequeue("order", 1, lease_ms=100)
            assert first.id == a1.id
            give_up = time.monotonic() + 10
            while (seen := dq.peek("order", a1.id)).last_error != "lease expired":
                assert time.monotonic() < give_up, seen
                time.sleep(0.02)
            assert seen.state == "delayed" and seen.deadline > dq.peek("order", a2.id).deadline
            server.kill()
            server.start()
            got: list[Item] = []
            give_up = time.monotonic() + 15
            while not got:  # a2 waits for a1 until its retry is due
                assert time.monotonic() < give_up
                got = dq.dequeue("order", 2, lease_ms=60_000, wait_ms=1000)
            assert [i.id for i in got] == [a1.id]
            dq.release_many("order", got)
            assert [i.id for i in dq.dequeue("order", 2, lease_ms=60_000, wait_ms=1000)] == [a2.id]
    finally:
        server.kill()
