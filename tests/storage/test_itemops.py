"""``ItemOps`` over a real engine, in process: a dequeue's rules, checked before anything
is released, in the rules' own words; what a dequeue answers beside its items; a ring
session's blocking long-poll, woken by a publication and ended by its session's stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release
from dq.storage.errors import BatchTooLarge, OutOfRange
from dq.storage.itemops import ItemOps


@pytest.fixture
def ops(tmp_path: Path) -> Iterator[ItemOps]:
    config = EngineConfig(fsync="never", compaction="inline", max_batch=5)
    with Engine.open(tmp_path / "data", config) as engine:
        yield ItemOps(engine, max_wait_ms=2_000)


@pytest.mark.parametrize(
    ("count", "lease_ms", "wait_ms", "words"),
    [
        (0, None, 0, "count must be between 1 and 5"),
        (6, None, 0, "count must be between 1 and 5"),
        (1, 0, 0, "lease_ms must be between 1 and 43200000"),
        (1, 43_200_001, 0, "lease_ms must be between 1 and 43200000"),
        (1, None, -1, "wait_ms must be between 0 and 281474976710655"),
    ],
)
def test_a_dequeue_breaking_a_rule_is_refused_in_its_words(
    ops: ItemOps, count: int, lease_ms: int | None, wait_ms: int, words: str
) -> None:
    with pytest.raises(OutOfRange) as refused:
        ops.check_dequeue(count, lease_ms, wait_ms)
    assert (str(refused.value), refused.value.code, refused.value.http_status) == (
        words,
        "validation_error",
        422,
    )


def test_the_engine_says_the_same_of_its_own_arguments(ops: ItemOps) -> None:
    ops.start_enqueue("q", [NewItem(b"v")]).result(5)
    for count, lease_ms, words in [
        (0, None, "count must be between 1 and 5"),
        (6, None, "count must be between 1 and 5"),
        (1, 43_200_001, "lease_ms must be between 1 and 43200000"),
    ]:
        with pytest.raises(OutOfRange) as refused:
            ops.engine.dequeue("q", count, lease_ms)
        assert str(refused.value) == words
    assert ops.engine.stats("q").leased == 0


def test_too_many_releases_carried_is_a_batch_too_large(ops: ItemOps) -> None:
    ops.check_dequeue(1, None, 0, releases=5)
    with pytest.raises(BatchTooLarge, match=r"^more than 5 items in one request; the limit is 5$"):
        ops.check_dequeue(1, None, 0, releases=6)
    with pytest.raises(BatchTooLarge) as refused:  # the engine's own check: the same words
        ops.start_release("q", [Release(1, "r")] * 6)
    assert str(refused.value) == "more than 5 items in one request; the limit is 5"


def test_a_dequeue_says_whether_the_queue_exists(ops: ItemOps) -> None:
    got = ops.lease("nobody-made-it", 1, None)
    assert (list(got), got.queue_exists, got.draining) == ([], False, False)
    ops.start_enqueue("made", [NewItem(b"v")]).result(5)
    got = ops.lease("made", 1, None)
    assert ([d.value for d in got], got.queue_exists) == ([b"v"], True)
    assert ops.lease("made", 1, None).queue_exists is True  # empty, but there


def test_waits_are_clamped_to_the_servers_maximum(ops: ItemOps) -> None:
    assert (ops.wait_ms(500), ops.wait_ms(60_000)) == (500, 2_000)


def test_a_blocking_long_poll_wakes_on_a_publication_and_stops_with_its_session(
    ops: ItemOps,
) -> None:
    woken, stop = threading.Event(), threading.Event()
    threading.Timer(0.2, lambda: ops.start_enqueue("late", [NewItem(b"x")])).start()
    t0 = time.monotonic()
    got = ops.lease_waiting("late", 1, None, 60_000, woken, stop)
    assert [d.value for d in got] == [b"x"] and time.monotonic() - t0 < 1.5

    def stop_session() -> None:  # as Session.stop does: the flag, then the wake-up
        stop.set()
        woken.set()

    threading.Timer(0.2, stop_session).start()
    t0 = time.monotonic()
    got = ops.lease_waiting("late", 1, None, 60_000, woken, stop)
    assert list(got) == [] and time.monotonic() - t0 < 1.0
    assert ops.waits.waiting == 0


def test_a_drain_ends_every_wait_and_later_ones_at_once(ops: ItemOps) -> None:
    woken, stop = threading.Event(), threading.Event()
    threading.Timer(0.2, ops.waits.drain).start()
    t0 = time.monotonic()
    got = ops.lease_waiting("quiet", 1, None, 60_000, woken, stop)
    assert (list(got), got.draining) == ([], True) and time.monotonic() - t0 < 1.0
    t0 = time.monotonic()
    assert list(ops.lease_waiting("quiet", 1, None, 60_000, woken, stop)) == []
    assert time.monotonic() - t0 < 0.2


def test_a_blocking_dequeue_without_a_wait_answers_as_a_long_poll_does(ops: ItemOps) -> None:
    """A ring FIND with no wait (``lease_waiting`` with ``wait_ms`` 0) leases at once and
    says what a long-poll's answer says beside its items: whether the queue exists, and
    once the server drains, that it does."""
    woken, stop = threading.Event(), threading.Event()
    got = ops.lease_waiting("nobody-made-it", 1, None, 0, woken, stop)
    assert (list(got), got.queue_exists, got.draining) == ([], False, False)
    ops.start_enqueue("made", [NewItem(b"a"), NewItem(b"b")]).result(5)
    got = ops.lease_waiting("made", 1, None, 0, woken, stop)
    assert ([d.value for d in got], got.queue_exists, got.draining) == ([b"a"], True, False)
    ops.waits.drain()
    got = ops.lease_waiting("made", 1, None, 0, woken, stop)
    assert ([d.value for d in got], got.queue_exists, got.draining) == ([b"b"], True, True)
    got = ops.lease_waiting("nobody-made-it", 1, None, 0, woken, stop)
    assert (list(got), got.queue_exists, got.draining) == ([], False, True)
