"""``stats.oldest_lease_age_ms``: the age of the oldest live lease from its dequeue
(extends do not reset it; docs/http.md), read from an index of dequeue times instead of a
walk over every lease (stats are read each second by the telemetry publisher and on every
``/metrics`` scrape, under the queue lock)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from dq.storage import Engine, Extend, NewItem, QueueConfig, Release, Requeue
from dq.storage._leases import RECORD, Lease, Leases
from dq.storage.codec import encode_key
from tests.storage.conftest import FakeClock

Open = Callable[..., Engine]


def walked(e: Engine, queue: str) -> int | None:
    """The figure as a walk over every live lease computes it."""
    since = [lease.since for _, lease in e.queue(queue).deliveries.leases.values()]
    return max(0, e.now() - min(since)) if since else None


def age(e: Engine, queue: str) -> int | None:
    got = e.stats(queue).oldest_lease_age_ms
    assert got == walked(e, queue)
    return got


def test_oldest_lease_age_through_extend_release_requeue_expiry_and_restart(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"%d" % i) for i in range(4)])
    assert age(e, "q") is None
    a, b = e.dequeue("q", 2, 10_000)
    clock.advance(100)
    assert len(e.dequeue("q", 2, 1_000)) == 2  # c and d, short leases
    clock.advance(400)
    assert age(e, "q") == 500  # a and b, dequeued first
    e.extend("q", [Extend(a.id, a.receipt, 60_000)])
    clock.advance(100)
    assert age(e, "q") == 600  # an extend does not make a lease younger
    e.release("q", [Release(a.id, a.receipt)])
    assert age(e, "q") == 600  # b was dequeued with a
    e.requeue("q", [Requeue(b.id, b.receipt, delay_ms=0)])
    assert age(e, "q") == 500  # c and d now
    clock.advance(200)
    (again,) = e.dequeue("q", 1, 60_000)  # b's item, a new delivery: its age starts over
    assert again.id == b.id
    assert age(e, "q") == 700
    clock.advance(400)  # c's and d's leases (1 s) have run out: not live any more
    assert e.expire_leases("q") == 2
    assert age(e, "q") == 400
    e.release("q", [Release(again.id, again.receipt)])
    assert age(e, "q") is None
    e.dequeue("q", 1, 60_000)
    clock.advance(50)
    assert age(e, "q") == 50
    e.close()
    e = open_engine()  # leases do not survive a restart: every item is pending again
    assert age(e, "q") is None
    assert e.stats("q").leased == 0
    clock.advance(10)
    e.dequeue("q", 1, 60_000)
    clock.advance(30)
    assert age(e, "q") == 30


class NoWalk:
    """The queue's leases, but any read of all of them fails."""

    def __init__(self, leases: Leases) -> None:
        self._leases = leases

    def __getattr__(self, name: str) -> Any:
        return getattr(self._leases, name)

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._leases

    def values(self) -> Any:
        raise AssertionError("stats walked every lease")


def test_stats_with_many_leases_do_not_walk_them(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    n = 5_000
    for _ in range(n // 1000):
        e.enqueue("q", [NewItem(b"") for _ in range(1000)])
    first = e.dequeue("q", 1, 600_000)
    clock.advance(5)
    rest = [d for _ in range(n // 1000) for d in e.dequeue("q", 1000, 600_000)]
    clock.advance(5)
    deliveries = e.queue("q").deliveries
    leases = deliveries.leases
    monkey = pytest.MonkeyPatch()
    monkey.setattr(deliveries, "leases", NoWalk(leases))
    try:
        assert e.stats("q").oldest_lease_age_ms == 10
        assert e.stats("q").leased == n
    finally:
        monkey.undo()
    done = first + rest[:-1]
    for i in range(0, len(done), 1000):
        e.release("q", [Release(d.id, d.receipt) for d in done[i : i + 1000]])
    assert age(e, "q") == 5
    # ended leases leave nothing behind a live one: one record's room is left
    assert len(leases) == 1 and leases.allocated < 64 * (RECORD + 16)


def brute(leases: Leases) -> int | None:
    since = [lease.since for _, lease in leases.values()]
    return min(since) if since else None


def test_index_matches_a_walk_under_random_operations() -> None:
    """Dequeue, extend, release, expiry and a put-back lease after a refused write, with a
    clock that sometimes steps back (a wall clock can): the index always agrees with a
    walk over the live leases (the test's own record of them), and its memory stays
    within a constant of what twice their peak number takes."""
    rng = random.Random(7)
    leases = Leases()
    now, next_id = 1_000_000, 1
    live: dict[int, tuple[str, int, int]] = {}  # id -> (receipt, since, expires)
    taken: list[tuple[int, Lease, str]] = []
    peak = 0
    for step in range(30_000):
        now += rng.choice((0, 0, 1, 5, 30, -40 if step % 97 == 0 else 2))
        op = rng.random()
        if op < 0.4 or not live:
            item_id, next_id = next_id, next_id + 1
            expires = now + rng.randint(1, 3000)
            key = encode_key(now, item_id)
            receipt = leases.add(item_id, key, 0, 0, 1, expires, None, now, None)
            live[item_id] = (receipt, now, expires)
        elif op < 0.55:
            item_id = rng.choice(list(live))
            receipt, since, expires = live[item_id]
            if expires > now:
                expires = now + rng.randint(1, 3000)
                assert leases.extend(item_id, receipt, next_id, now, expires) == receipt
                live[item_id] = (receipt, since, expires)
        elif op < 0.8:
            item_id = rng.choice(list(live))
            taken.append((item_id, leases.pop(item_id), live.pop(item_id)[0]))
        elif op < 0.9:
            gone = leases.pop_expired(now)
            want = sorted((x, i) for i, (_r, _s, x) in live.items() if x <= now)
            assert [(lease.expires, i) for i, lease in gone] == want
            for _x, i in want:
                del live[i]
        elif taken:
            item_id, lease, receipt = taken.pop(rng.randrange(len(taken)))
            if item_id not in leases:
                leases.restore(item_id, lease)
                live[item_id] = (receipt, lease.since, lease.expires)
        if step % 7 == 0:
            assert leases.oldest_since() == min((s for _r, s, _x in live.values()), default=None)
            assert leases.next_expiry() == min((x for _r, _s, x in live.values()), default=None)
            assert brute(leases) == leases.oldest_since()
        peak = max(peak, len(leases))
        assert len(leases) == len(live)
        assert leases.allocated <= 2 * peak * (RECORD + 16) + 64 * (RECORD + 16)
    assert leases.oldest_since() == brute(leases)


def test_a_dequeue_moves_back_exactly_the_leases_that_ran_out_by_now(
    open_engine: Open, clock: FakeClock
) -> None:
    """Dequeue itself moves back what ran out (no expiry task runs here), and looks for
    it only when the earliest expiry it knows of is not after now: leases extended
    (longer and shorter) and released leave older entries behind, which must neither
    hide an expiry nor move back a live lease."""
    e = open_engine()
    e.put_queue("q", QueueConfig())
    a, b, c, d = e.enqueue("q", [NewItem(v) for v in (b"a", b"b", b"c", b"d")])
    leased = {x.id: x for x in e.dequeue("q", 4, 10_000)}
    assert sorted(leased) == [a.id, b.id, c.id, d.id]
    start = clock.now
    clock.advance(100)
    e.extend("q", [Extend(a.id, leased[a.id].receipt, 5000)])  # runs out at 5100
    e.extend("q", [Extend(b.id, leased[b.id].receipt, 500)])  # shorter: runs out at 600
    e.release("q", [Release(c.id, leased[c.id].receipt)])
    # d runs out at 10_000

    def dequeued_at(t: int) -> list[tuple[int, int]]:
        clock.advance(t - (clock.now - start))
        return [(x.id, x.stats.dequeue_count) for x in e.dequeue("q", 4, 60_000)]

    assert dequeued_at(599) == []
    assert dequeued_at(600) == [(b.id, 2)]  # at its expiry exactly
    assert dequeued_at(5099) == []
    assert dequeued_at(5100) == [(a.id, 2)]
    assert dequeued_at(9999) == []
    assert dequeued_at(10_000) == [(d.id, 2)]
    assert e.stats("q").lease_expired == 3
