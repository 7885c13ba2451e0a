"""The delivery rules as the shared-memory ring's commands meet them (the compiled
session calls ``CommandHandler.find`` for a FIND and ``release_one`` for a DELETE):
the ring's dequeue is the engine's, so ``group_limit``, ``leased_limit`` and ``rate_limit``
hold there as over HTTP, a released slot lets the next item of its group go, and a FIND
that long-polls waits for a freed slot or the next token within its wait
(``docs/delivery.md``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.shm.command_handler import CommandHandler
from dq.storage import (
    Delivery,
    Engine,
    EngineConfig,
    NewItem,
    QueueConfig,
    RateLimit,
    Release,
)

WAIT_S = 10.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine.open(tmp_path / "data", EngineConfig(fsync="never"))
    try:
        yield e
    finally:
        e.close()


def _find(h: CommandHandler, count: int, wait_ms: int = 0) -> list[Delivery]:
    return list(h.find(count, wait_ms, 60_000))


def _release(h: CommandHandler, d: Delivery) -> None:
    (outcome,) = h.release_one(d.id, d.receipt).result(timeout=WAIT_S)
    assert outcome.ok, outcome


def test_group_limit_and_leased_limit_hold_over_the_ring(engine: Engine) -> None:
    engine.put_queue("jobs", QueueConfig(group_limit=1, leased_limit=3))
    ids = [
        e.id
        for e in engine.enqueue("jobs", [NewItem(b"%d" % n, group=f"c{n % 4}") for n in range(12)])
    ]
    h = CommandHandler(engine, "jobs", threading.Event())
    first = _find(h, 10)
    # one per group, and no more than three in all: c0, c1, c2's first items
    assert [d.id for d in first] == ids[:3]
    assert _find(h, 10) == []
    _release(h, first[0])  # c0's slot and a queue slot free: c3's first is the oldest
    assert [d.id for d in _find(h, 10)] == [ids[3]]
    _release(h, first[1])  # c1 is free again: its second item goes (c0's waits its turn)
    assert [d.id for d in _find(h, 10)] == [ids[4]]


def test_a_long_poll_over_the_ring_waits_for_a_freed_slot(engine: Engine) -> None:
    engine.put_queue("jobs", QueueConfig(group_limit=1))
    engine.enqueue("jobs", [NewItem(b"a", group="c"), NewItem(b"b", group="c")])
    h = CommandHandler(engine, "jobs", threading.Event())
    (held,) = _find(h, 5)
    timer = threading.Timer(0.3, lambda: engine.release("jobs", [Release(held.id, held.receipt)]))
    timer.start()
    try:
        start = time.monotonic()
        got = _find(h, 5, wait_ms=5_000)
        waited = time.monotonic() - start
    finally:
        timer.cancel()
    assert [d.value for d in got] == [b"b"]
    assert 0.2 <= waited < 4.0, waited


def test_a_long_poll_over_the_ring_waits_for_the_next_token(engine: Engine) -> None:
    engine.put_queue("mail", QueueConfig(rate_limit=RateLimit(per_second=5, burst=2)))
    engine.enqueue("mail", [NewItem(b"m%d" % n) for n in range(5)])
    h = CommandHandler(engine, "mail", threading.Event())
    assert len(_find(h, 5)) == 2  # the burst
    assert _find(h, 5) == []  # no token: the items stay due
    start = time.monotonic()
    got = _find(h, 5, wait_ms=3_000)
    waited = time.monotonic() - start
    assert len(got) == 1 and 0.1 <= waited < 2.0, (got, waited)
    assert engine.stats("mail").rate_limited >= 1
