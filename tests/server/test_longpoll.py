"""``LongPoll`` over a real engine, in process: wake-ups, re-checks and drain."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from dq.server.longpoll import LongPoll
from dq.storage import Engine, EngineConfig, NewItem, QueueConfig


def _engine(tmp_path: Path) -> Engine:
    return Engine.open(tmp_path / "data", EngineConfig(fsync="never", compaction="inline"))


def test_wakes_on_enqueue_from_another_thread(tmp_path: Path) -> None:
    with _engine(tmp_path) as engine:
        engine.enqueue("q", [NewItem(b"first")])
        engine.dequeue("q")

        async def run() -> tuple[list[bytes], float, int]:
            lp = LongPoll(engine, asyncio.get_running_loop())
            timer = threading.Timer(0.2, lambda: engine.enqueue("q", [NewItem(b"late")]))
            t0 = time.monotonic()
            timer.start()
            got = await lp.dequeue("q", 5, None, 5_000)
            timer.join(5)
            return [d.value for d in got], time.monotonic() - t0, lp.waiting

        values, took, waiting = asyncio.run(run())
    assert values == [b"late"] and took < 4.0 and waiting == 0


def test_wakes_when_a_delayed_item_becomes_due(tmp_path: Path) -> None:
    with _engine(tmp_path) as engine:
        (done,) = engine.enqueue("q", [NewItem(b"soon", delay_ms=150)])

        async def run() -> tuple[list[bytes], float, int]:
            lp = LongPoll(engine, asyncio.get_running_loop())
            t0 = time.monotonic()
            got = await lp.dequeue("q", 1, None, 5_000)
            return [d.value for d in got], time.monotonic() - t0, engine.now()

        values, took, now = asyncio.run(run())
    assert values == [b"soon"] and now >= done.deadline and took < 4.0


def test_many_waiters_share_one_subscription_and_drain_ends_them(tmp_path: Path) -> None:
    with _engine(tmp_path) as engine:
        engine.put_queue("q", QueueConfig())

        async def run() -> tuple[list[int], int, int]:
            lp = LongPoll(engine, asyncio.get_running_loop())
            waits = [asyncio.create_task(lp.dequeue("q", 1, None, 10_000)) for _ in range(20)]
            await asyncio.sleep(0.1)
            during = lp.waiting
            engine.enqueue("q", [NewItem(b"one")])
            await asyncio.sleep(0.1)
            lp.drain()
            got = await asyncio.wait_for(asyncio.gather(*waits), 5)
            return [len(g) for g in got], during, lp.waiting

        sizes, during, after = asyncio.run(run())
    assert sorted(sizes) == [0] * 19 + [1]  # exactly one waiter got the item
    assert during == 20 and after == 0


class _Counting:
    """The engine, counting ``dequeue`` calls (each is one waiter that woke to look)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.dequeues = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    def dequeue(self, *args: object) -> object:
        self.dequeues += 1
        return self._engine.dequeue(*args)  # type: ignore[arg-type]


def test_a_publication_wakes_as_many_waiters_as_it_can_serve(tmp_path: Path) -> None:
    with _engine(tmp_path) as engine:
        engine.put_queue("q", QueueConfig())
        counting = _Counting(engine)

        async def run() -> tuple[int, int, list[int]]:
            lp = LongPoll(counting, asyncio.get_running_loop())  # type: ignore[arg-type]
            waits = [asyncio.create_task(lp.dequeue("q", 1, None, 10_000)) for _ in range(100)]
            await asyncio.sleep(0.2)
            before = counting.dequeues
            engine.enqueue("q", [NewItem(b"one")])
            await asyncio.sleep(0.2)
            one = counting.dequeues - before
            engine.enqueue("q", [NewItem(b"x")] * 10)
            await asyncio.sleep(0.3)
            ten = counting.dequeues - before - one
            lp.drain()
            got = await asyncio.wait_for(asyncio.gather(*waits), 5)
            return one, ten, [len(g) for g in got]

        one, ten, sizes = asyncio.run(run())
    assert sorted(sizes) == [0] * 89 + [1] * 11  # every item reached one waiter
    assert one <= 3  # not 100: the served waiter passes the turn on, once
    assert ten <= 13


def test_waits_for_a_queue_that_does_not_exist_yet(tmp_path: Path) -> None:
    with _engine(tmp_path) as engine:

        async def run() -> tuple[list[bytes], float]:
            lp = LongPoll(engine, asyncio.get_running_loop())
            timer = threading.Timer(0.2, lambda: engine.enqueue("new", [NewItem(b"first")]))
            t0 = time.monotonic()
            timer.start()
            got = await lp.dequeue("new", 5, None, 5_000)
            timer.join(5)
            return [d.value for d in got], time.monotonic() - t0

        values, took = asyncio.run(run())
    assert values == [b"first"] and took < 4.0
