"""``dq.server.keyed_batches`` against a real engine with a test clock (no HTTP, no Spark)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.server.keyed_batches import ITEM_COST, KEY_COST, IdempotentBatches
from dq.storage import Engine, EngineConfig, NewItem
from dq.storage.errors import StorageError
from tests.server.clocked import Clock

Q = "jobs"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(tmp_path: Path, clock: Clock) -> Iterator[Engine]:
    e = Engine.open(str(tmp_path / "data"), EngineConfig(fsync="never"), clock=clock)
    yield e
    e.close()


def test_idempotent_batches_run_once(engine: Engine, clock: Clock) -> None:
    batches = IdempotentBatches(engine, ttl_s=60, max_keys=2, clock=clock.seconds)
    first, replayed = batches.enqueue(Q, "job:0:0", [NewItem(b"a"), NewItem(b"b")])
    assert not replayed
    again, replayed = batches.enqueue(Q, "job:0:0", [NewItem(b"a"), NewItem(b"b")])
    assert replayed and again == first
    assert engine.stats(Q).pending == 2
    clock.ms += 61_000
    _, replayed = batches.enqueue(Q, "job:0:0", [NewItem(b"a")])
    assert not replayed
    assert engine.stats(Q).pending == 3


def test_idempotent_batch_with_other_items_is_enqueued(engine: Engine, clock: Clock) -> None:
    """A retried task whose input changed must not lose rows: enqueue again."""
    batches = IdempotentBatches(engine, clock=clock.seconds)
    batches.enqueue(Q, "job:0:0", [NewItem(b"a")])
    _, replayed = batches.enqueue(Q, "job:0:0", [NewItem(b"b")])
    assert not replayed
    assert batches.mismatches == 1
    assert engine.stats(Q).pending == 2


def test_a_refused_batch_leaves_nothing_behind(engine: Engine, clock: Clock) -> None:
    """The engine refuses the batch: its key is neither running nor remembered, and the
    retry runs (it was once left in the running table for ever)."""
    batches = IdempotentBatches(engine, clock=clock.seconds)
    with pytest.raises(StorageError):
        batches.enqueue("bad name!", "job:0:0", [NewItem(b"a")])
    assert batches.running == 0
    assert batches.remembered_bytes == 0
    with pytest.raises(StorageError):
        batches.enqueue("bad name!", "job:0:0", [NewItem(b"a")])
    assert batches.running == 0


def test_one_key_runs_one_at_a_time(engine: Engine, clock: Clock) -> None:
    batches = IdempotentBatches(engine, clock=clock.seconds)
    results: list[bool] = []

    def send() -> None:
        results.append(batches.enqueue(Q, "job:0:0", [NewItem(b"a")])[1])

    threads = [threading.Thread(target=send) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(results) == [False] + [True] * 7
    assert engine.stats(Q).pending == 1
    assert batches.running == 0


def test_remembered_results_are_bounded_in_bytes(engine: Engine, clock: Clock) -> None:
    one = KEY_COST + len(Q) + len("job:0") + 100 * ITEM_COST
    batches = IdempotentBatches(engine, max_bytes=3 * one, clock=clock.seconds)
    rows = [NewItem(b"r") for _ in range(100)]
    for i in range(5):
        batches.enqueue(Q, f"job:{i}", rows)
    assert batches.remembered_bytes == 3 * one
    assert batches.enqueue(Q, "job:4", rows)[1]  # the newest are remembered
    assert not batches.enqueue(Q, "job:0", rows)[1]  # the oldest were forgotten
    assert engine.stats(Q).pending == 600
