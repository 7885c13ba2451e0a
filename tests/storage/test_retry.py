"""The retry policy (storage/retry.py) and fail (storage/queue_items.py), through the
engine: the next deadline follows the policy, the reasons stay with the item through
restarts, freezes, merges, dead-lettering and redrive."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Delivery, Engine, Fail, NewItem, QueueConfig, Release, Requeue, RetryPolicy
from dq.storage.errors import InvalidArgument, OutOfRange
from dq.storage.reasons import LEASE_EXPIRED, MAX_ERROR_BYTES, MAX_REASONS, OLDER_REASON_BYTES
from dq.storage.retry import retry_from_json
from tests.storage.conftest import FakeClock

Q = "jobs"
Open = Callable[..., Engine]


def test_exponential_delays_grow_to_the_cap() -> None:
    p = RetryPolicy(initial_ms=1000, multiplier=2, max_ms=5000)
    assert [p.delay_ms(n) for n in range(1, 6)] == [1000, 2000, 4000, 5000, 5000]
    assert p.delay_ms(10_000) == 5000  # no float overflow for a long-failing item


def test_jitter_shortens_by_at_most_its_share() -> None:
    p = RetryPolicy(initial_ms=1000, multiplier=1, max_ms=1000, jitter=0.25)
    assert p.delay_ms(1, rand=lambda: 0.0) == 1000
    assert p.delay_ms(1, rand=lambda: 0.999999) == 750
    assert all(750 <= p.delay_ms(1) <= 1000 for _ in range(200))


def test_a_list_of_delays_repeats_its_last() -> None:
    p = retry_from_json({"delays_ms": [10, 200, 3000]})
    assert p is not None
    assert [p.delay_ms(n) for n in range(1, 6)] == [10, 200, 3000, 3000, 3000]
    assert p.to_json() == {"delays_ms": [10, 200, 3000]}


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({}, "needs initial_ms"),
        ({"initial_ms": -1}, "retry.initial_ms must be"),
        ({"initial_ms": 10, "multiplier": 0.5}, "retry.multiplier must be a number between 1"),
        ({"initial_ms": 10, "jitter": 1.5}, "retry.jitter must be a number between 0 and 1"),
        ({"initial_ms": 100, "max_ms": 10}, "must be at least initial_ms"),
        ({"delays_ms": []}, "list of 1 to 100"),
        ({"delays_ms": [1], "initial_ms": 1}, "not both"),
        ({"initial_ms": 1, "backoff": 2}, "no field 'backoff'"),
        ("fast", "must be an object"),
    ],
)
def test_bad_policies_are_refused_naming_the_field(raw: object, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        retry_from_json(raw)


def _lease(e: Engine, n: int = 1, lease_ms: int = 1000) -> list[Delivery]:
    got = e.dequeue(Q, n, lease_ms)
    assert got
    return got


def test_fail_follows_the_policy_and_the_next_delivery_says_why(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(retry=RetryPolicy(initial_ms=1000, multiplier=3, max_ms=60_000)))
    e.enqueue(Q, [NewItem(b"job")])
    waits = []
    for attempt in range(1, 4):
        d = _lease(e)[0]
        assert d.stats.dequeue_count == attempt
        if attempt == 1:
            assert d.last_error is None and d.last_error_at is None
        else:
            assert d.last_error == f"ValueError: try {attempt - 1}"
        out = e.fail(Q, [Fail(d.id, d.receipt, f"ValueError: try {attempt}")])
        assert out[0].ok
        waits.append(out[0].deadline - clock.now)
        assert e.dequeue(Q, 1) == []  # not due before the policy says
        clock.advance(waits[-1])
    assert waits == [1000, 3000, 9000]
    d = _lease(e)[0]
    assert (d.last_error, d.last_error_at) == ("ValueError: try 3", clock.now - 9000)
    page = e.browse(Q, "all")
    assert [r.error for r in page.items[0].errors or ()] == [
        "ValueError: try 3",
        "ValueError: try 2",
        "ValueError: try 1",
    ]
    assert e.release(Q, [Release(d.id, d.receipt)])[0].ok


def test_without_a_policy_a_failed_item_is_due_at_once(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"job")])
    d = _lease(e)[0]
    out = e.fail(Q, [Fail(d.id, d.receipt, "boom")])
    assert out[0].deadline - clock.now <= 1  # due now (placed just past the cursor)
    clock.advance(1)
    again = _lease(e)[0]
    assert again.last_error == "boom"


def test_an_expired_lease_waits_per_the_policy_and_says_lease_expired(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(retry=RetryPolicy(delays_ms=(5000, 20_000))))
    e.enqueue(Q, [NewItem(b"job")])
    _lease(e, lease_ms=100)
    clock.advance(100)
    expired_at = clock.now
    assert e.expire_leases(Q) == 1
    clock.advance(4999)
    assert e.dequeue(Q, 1) == []
    clock.advance(1)
    d = _lease(e, lease_ms=100)[0]
    assert (d.last_error, d.last_error_at) == (LEASE_EXPIRED, expired_at)
    clock.advance(100)
    e.expire_leases(Q)
    clock.advance(19_999)
    assert e.dequeue(Q, 1) == []


def test_a_stale_receipt_fails_nothing(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"job")])
    d = _lease(e)[0]
    assert e.requeue(Q, [Requeue(d.id, d.receipt)])[0].ok
    out = e.fail(Q, [Fail(d.id, d.receipt, "late")])
    assert out[0].error == "stale_receipt"
    clock.advance(1)
    assert _lease(e)[0].last_error is None


def test_an_error_over_4_kib_refuses_the_batch(open_engine: Open) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"a"), NewItem(b"b")])
    a, b = _lease(e, 2)
    with pytest.raises(OutOfRange, match="at most 4096 bytes"):
        e.fail(Q, [Fail(a.id, a.receipt, "ok"), Fail(b.id, b.receipt, "é" * 2049)])
    # nothing was done: both leases still hold
    assert [o.ok for o in e.release(Q, [Release(a.id, a.receipt), Release(b.id, b.receipt)])] == [
        True,
        True,
    ]


def test_the_history_is_bounded(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"job")])
    for n in range(MAX_REASONS + 3):
        clock.advance(1)
        d = _lease(e)[0]
        e.fail(Q, [Fail(d.id, d.receipt, f"{n}:" + "x" * (MAX_ERROR_BYTES - 10))])
    errors = e.peek(Q, 1).errors
    assert errors is not None and len(errors) == MAX_REASONS
    assert errors[0].error.startswith(f"{MAX_REASONS + 2}:")
    assert len(errors[0].error) == MAX_ERROR_BYTES - 8  # the newest kept whole
    assert all(len(r.error.encode()) <= OLDER_REASON_BYTES for r in errors[1:])


def test_reasons_survive_a_restart_a_freeze_and_a_merge(
    open_engine: Open, tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "data"
    e = open_engine(path=path)
    e.put_queue(Q, QueueConfig(retry=RetryPolicy(delays_ms=(1000,))))
    e.enqueue(Q, [NewItem(b"one"), NewItem(b"two")])
    a, b = _lease(e, 2)
    e.fail(Q, [Fail(a.id, a.receipt, "first failed"), Fail(b.id, b.receipt, "second failed")])
    e.close()
    e = open_engine(path=path)
    assert [i.errors[0].error for i in e.browse(Q, "all").items if i.errors] == [
        "first failed",
        "second failed",
    ]
    e.freeze(Q)  # the reasons leave memory for the sidecar; read back on delivery
    q = e.queue(Q)
    assert all(n.reasons is None for n in q.meta.errors.notes.values())
    e.enqueue(Q, [NewItem(b"more")])
    e.freeze(Q)
    q.merge(0, len(q.segments))
    e.close()
    e = open_engine(path=path)  # now the reasons are read from the sidecars
    clock.advance(1000)
    got = {d.value: d.last_error for d in e.dequeue(Q, 3, 1000)}
    assert got == {b"one": "first failed", b"two": "second failed", b"more": None}


def test_a_dead_letter_keeps_its_reasons_and_a_redrive_starts_afresh(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.put_queue(Q, QueueConfig(max_deliveries=2, retry=RetryPolicy(delays_ms=(60_000,))))
    e.enqueue(Q, [NewItem(b"poison")])
    d = _lease(e)[0]
    e.fail(Q, [Fail(d.id, d.receipt, "bad input 1")])
    clock.advance(60_000)
    d = _lease(e)[0]
    out = e.fail(Q, [Fail(d.id, d.receipt, "bad input 2")])
    assert out[0].deadline - clock.now <= 1  # out of deliveries: no wait for a retry
    clock.advance(1)
    assert e.dequeue(Q, 1) == []  # moved to the dead-letter queue instead
    dead = e.browse("jobs.dlq", "all").items
    assert [r.error for r in dead[0].errors or ()] == ["bad input 2", "bad input 1"]
    assert dead[0].stats is not None and dead[0].stats.requeue_time == clock.now
    assert e.redrive("jobs.dlq").moved == 1
    d = _lease(e)[0]
    assert d.stats.dequeue_count == 1  # attempts start afresh
    assert d.last_error == "bad input 2"
    assert [r.error for r in e.peek(Q, d.id).errors or ()] == ["bad input 2", "bad input 1"]


def test_a_released_item_leaves_its_reasons_behind(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.enqueue(Q, [NewItem(b"job")])
    d = _lease(e)[0]
    e.fail(Q, [Fail(d.id, d.receipt, "once")])
    clock.advance(1)
    d = _lease(e)[0]
    e.release(Q, [Release(d.id, d.receipt)])
    q = e.queue(Q)
    assert len(q.meta.errors) == 1
    assert e.forget_gone_reasons(q) == 1
    assert len(q.meta.errors) == 0
