"""The consumer helpers and the async client against a live server."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dq.client import AsyncClient, Backoff, Client, Item
from dq.client._calls import Call
from tests.client.scripted import DROP, Answer, scripted
from tests.server.live import LiveServer

pytestmark = pytest.mark.integration  # live and scripted servers, forked workers


def test_backoff_grows_and_caps() -> None:
    b = Backoff(base_ms=100, factor=2.0, max_ms=1000, jitter=0.0)
    assert [b.delay_ms(n) for n in (1, 2, 3, 4, 5, 6)] == [100, 200, 400, 800, 1000, 1000]
    jittered = Backoff(base_ms=1000, jitter=0.1)
    assert all(900 <= jittered.delay_ms(1) <= 1100 for _ in range(50))


def test_consumer_releases_on_success_and_requeues_on_failure(dq: Client, queue: str) -> None:
    dq.enqueue_many(queue, [b"ok-1", b"boom", b"ok-2"])
    seen: list[bytes] = []

    def handler(item: Item) -> None:
        seen.append(item.value)
        if item.value == b"boom":
            raise RuntimeError("handler failed")

    consumer = dq.consumer(queue, count=3, wait_ms=1_000, backoff=Backoff(base_ms=60_000, jitter=0))
    stats = consumer.run(handler, max_items=3)
    assert seen == [b"ok-1", b"boom", b"ok-2"]
    assert (stats.released, stats.requeued, stats.lost) == (2, 1, 0)
    info = dq.queue(queue).stats
    assert (info.pending, info.delayed, info.leased) == (1, 1, 0)  # boom waits out its backoff


def test_consumer_extends_leases_while_the_handler_runs(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"slow")
    consumer = dq.consumer(queue, lease_ms=1_000, wait_ms=1_000)
    other: list[Item] = []

    def slow(item: Item) -> None:
        give_up = time.monotonic() + 2.5  # two and a half lease lengths
        while time.monotonic() < give_up:
            other.extend(dq.dequeue(queue))  # nobody else may get it meanwhile
            time.sleep(0.1)

    stats = consumer.run(slow, max_items=1)
    assert other == [] and stats.released == 1 and stats.lost == 0
    assert dq.queue(queue).stats.pending == 0


def test_consumer_stops_on_event(dq: Client, queue: str) -> None:
    dq.put_queue(queue)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    t0 = time.monotonic()
    stats = dq.consumer(queue, wait_ms=200).run(lambda item: None, stop=stop)
    assert stats.released == 0 and time.monotonic() - t0 < 5


def test_a_consumer_of_a_queue_nobody_created_says_so_once(
    dq: Client, server: LiveServer, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker may start before its producer, but one on a misspelled name would wait in
    silence: each consumer helper logs one warning, however many polls come back empty,
    and goes on to serve the queue once it exists."""
    name, other = queue + "-typo", queue + "-typo2"
    stop = threading.Event()
    threading.Timer(0.8, lambda: dq.enqueue(name, b"first")).start()
    threading.Timer(5.0, stop.set).start()  # a bound, should the item never come

    async def run_async() -> None:
        stopped = asyncio.Event()
        asyncio.get_running_loop().call_later(0.6, stopped.set)

        async def handle(item: Item) -> None:
            pass

        async with AsyncClient(server.url) as adq:
            await adq.consumer(other, wait_ms=100).run(handle, stop=stopped)

    with caplog.at_level("WARNING", logger="dq.client.jobs"):
        stats = dq.consumer(name, wait_ms=100).run(lambda item: stop.set(), stop=stop)
        asyncio.run(run_async())
    assert stats.released == 1
    said = [m for m in caplog.messages if "does not exist" in m]
    assert said == [
        f"queue {q} does not exist (yet): waiting for a producer to create it (is the name right?)"
        for q in (name, other)
    ]


def _until(what: Any, seconds: float = 20.0) -> None:
    give_up = time.monotonic() + seconds
    while not what():
        assert time.monotonic() < give_up, "timed out"
        time.sleep(0.05)


def test_a_worker_loop_rides_out_a_server_restart(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", fsync="always").start()
    try:
        with Client(server.url, timeout=5) as dq:
            dq.enqueue("jobs", b"before")
            seen: list[bytes] = []
            ended: list[object] = []
            stop = threading.Event()
            consumer = dq.consumer("jobs", lease_ms=5_000, wait_ms=500)

            def work() -> None:
                try:
                    ended.append(consumer.run(lambda item: seen.append(item.value), stop=stop))
                except BaseException as exc:  # what the loop must not do
                    ended.append(exc)

            worker = threading.Thread(target=work)
            worker.start()
            try:
                _until(lambda: dq.queue("jobs").stats.pending == 0)  # "before" released
                server.kill()  # SIGKILL: the dequeue in flight gets no answer
                time.sleep(1.5)  # longer than the transport's own retries
                assert worker.is_alive() and ended == []
                server.start()
                dq.enqueue("jobs", b"after")
                _until(lambda: b"after" in seen)
            finally:
                stop.set()
                worker.join(15)
            assert seen == [b"before", b"after"]
            assert [type(e).__name__ for e in ended] == ["ConsumerStats"]
    finally:
        server.kill()


def test_an_async_worker_loop_waits_out_a_server_that_is_starting() -> None:
    item = {
        "id": 1,
        "receipt": "r.1.1",
        "value": "x",
        "encoding": "utf-8",
        "deadline": 1,
        "stats": {"enqueue_time": 1, "requeue_time": 0, "dequeue_count": 1},
        "lease_expires": 2,
    }
    script = [
        Answer(503, {"error": "unavailable", "message": "starting"}),
        Answer(200, {"items": [item]}),
        Answer(200, {"results": [{"id": 1, "ok": True}]}),
    ]

    async def run() -> list[bytes]:
        seen: list[bytes] = []

        async def handler(it: Item) -> None:
            seen.append(it.value)

        async with AsyncClient(server.url) as dq:
            stats = await dq.consumer("q", wait_ms=0).run(handler, max_items=1)
        assert stats.released == 1
        return seen

    with scripted(*script) as server:
        assert asyncio.run(asyncio.wait_for(run(), 10)) == [b"x"]
    assert [path for _, path, _ in server.seen] == [
        "/v1/queues/q/dequeue",
        "/v1/queues/q/dequeue",
        "/v1/queues/q/release",
    ]


def test_a_batch_whose_jobs_together_outlast_the_lease_loses_none(dq: Client, queue: str) -> None:
    """``count=3`` and jobs of 0.7 s on a 1 s lease: the later jobs wait for the earlier
    ones, and the finished ones wait for their releases; every lease must hold."""
    dq.enqueue_many(queue, [b"a", b"b", b"c"])
    seen: list[bytes] = []
    consumer = dq.consumer(queue, lease_ms=1_000, count=3, wait_ms=0)
    stats = consumer.run(lambda item: (seen.append(item.value), time.sleep(0.7)), max_items=3)
    assert seen == [b"a", b"b", b"c"]
    assert (stats.released, stats.lost) == (3, 0)
    assert dq.queue(queue).stats.pending == 0


def test_an_async_batch_whose_jobs_together_outlast_the_lease_loses_none(
    server: LiveServer, queue: str
) -> None:
    async def run() -> None:
        async with AsyncClient(server.url) as dq:
            await dq.enqueue_many(queue, [b"a", b"b", b"c"])
            seen: list[bytes] = []

            async def handler(item: Item) -> None:
                seen.append(item.value)
                await asyncio.sleep(0.7)

            consumer = dq.consumer(queue, lease_ms=1_000, count=3, wait_ms=0)
            stats = await consumer.run(handler, max_items=3)
            assert seen == [b"a", b"b", b"c"]
            assert (stats.released, stats.lost) == (3, 0)
            assert (await dq.queue(queue)).stats.pending == 0

    asyncio.run(run())


def test_a_release_between_jobs_that_finds_no_server_is_sent_again_later() -> None:
    item = {
        "receipt": "r",
        "value": "x",
        "encoding": "utf-8",
        "deadline": 1,
        "stats": {"enqueue_time": 1, "requeue_time": 0, "dequeue_count": 1},
        "lease_expires": 2,
    }
    two = {"items": [{**item, "id": 1}, {**item, "id": 2}]}
    ok = {"results": [{"id": 1, "ok": True}, {"id": 2, "ok": True}]}
    with scripted(Answer(200, two), DROP, Answer(200, ok)) as server, Client(server.url) as dq:
        stats = dq.consumer("q", count=2, wait_ms=0).run(lambda item: None, max_items=2)
    assert (stats.released, stats.lost) == (2, 0)
    assert [path for _, path, _ in server.seen][-2:] == ["/v1/queues/q/release"] * 2
    assert b'"id":1' in server.seen[-1][2] and b'"id":2' in server.seen[-1][2]


def test_async_client_and_consumer(server: LiveServer, queue: str) -> None:
    async def run() -> None:
        async with AsyncClient(server.url) as dq:
            ids = [e.id for e in await dq.enqueue_many(queue, [b"a", b"b", b"bad"])]
            assert await dq.enqueue(queue, b"c") == ids[-1] + 1
            handled: list[bytes] = []

            async def handler(item: Item) -> None:
                handled.append(item.value)
                if item.value == b"bad":
                    raise ValueError("no")

            consumer = dq.consumer(queue, count=10, wait_ms=500, backoff=Backoff(base_ms=50_000))
            stats = await consumer.run(handler, max_items=4)
            assert handled == [b"a", b"b", b"bad", b"c"]
            assert (stats.released, stats.requeued) == (3, 1)
            info = await dq.queue(queue)
            assert info.stats.delayed == 1
            assert queue in [q.name for q in await dq.queues()]
            await dq.delete_queue(queue)
            assert (await dq.health())["status"] == "ok"

    asyncio.run(run())


@pytest.mark.parametrize("count", [1, 5])
def test_async_long_poll(server: LiveServer, queue: str, count: int) -> None:
    async def run() -> list[Item]:
        async with AsyncClient(server.url) as dq:
            await dq.put_queue(queue)
            waiter = asyncio.create_task(dq.dequeue(queue, count=count, wait_ms=4_000))
            await asyncio.sleep(0.2)
            await dq.enqueue(queue, b"x")
            return await asyncio.wait_for(waiter, 10)

    assert [i.value for i in asyncio.run(run())] == [b"x"]


def test_a_worker_loop_costs_one_request_per_item(dq: Client, queue: str) -> None:
    dq.enqueue_many(queue, [b"%d" % i for i in range(5)])
    calls: Counter[str] = Counter()
    transport = dq.transport

    class Counting:
        """A transport wrapping another: one method to wrap."""

        def call(self, call: Call[Any]) -> Any:
            calls[type(call).__name__] += 1
            return transport.call(call)

        def close(self) -> None:
            transport.close()

    counting = Client(dq.url, transport=Counting())
    seen: list[bytes] = []
    stats = counting.consumer(queue, wait_ms=200).run(lambda i: seen.append(i.value), max_items=5)
    assert seen == [b"0", b"1", b"2", b"3", b"4"] and stats.released == 5
    # each release rode on the next dequeue; the last one went alone when the loop ended
    assert calls == {"Dequeue": 5, "ReleaseMany": 1}
    assert dq.queue(queue).stats.pending == 0


def test_a_release_that_comes_too_late_counts_as_lost(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"slow")
    consumer = dq.consumer(queue, lease_ms=300, wait_ms=2_000)
    jobs = consumer.jobs(max_items=2)
    with next(jobs):
        pass  # done: its release waits for the next dequeue ...
    time.sleep(0.6)  # ... which comes after the lease ran out: the item is delivered again
    with next(jobs) as again:
        assert again.item.value == b"slow" and again.item.stats.dequeue_count == 2
    assert (consumer.stats.released, consumer.stats.lost) == (0, 1)
    jobs.close()  # leaving the loop releases what is left
    assert (consumer.stats.released, consumer.stats.lost) == (1, 1)
    assert dq.queue(queue).stats.pending == 0


def _lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("dq-lease-")]


def test_a_job_gets_a_lease_keeper_only_once_it_needs_an_extension(dq: Client, queue: str) -> None:
    """A job that ends before its first extension starts no keeper thread; one that runs
    longer gets its own and keeps its lease (the slow-handler test above)."""
    dq.enqueue_many(queue, [b"%d" % i for i in range(10)])
    keepers: list[list[str]] = []

    def quick(item: Item) -> None:
        keepers.append([n for n in _lease_threads() if n != "dq-lease-starter"])

    stats = dq.consumer(queue, lease_ms=3_000, wait_ms=500).run(quick, max_items=10)
    assert stats.released == 10 and keepers == [[]] * 10
    dq.enqueue(queue, b"slow")
    consumer = dq.consumer(queue, lease_ms=600, wait_ms=500)

    def slow(item: Item) -> None:
        give_up = time.monotonic() + 5
        while f"dq-lease-{item.id}" not in _lease_threads():
            assert time.monotonic() < give_up, "no keeper after one extension period"
            time.sleep(0.02)
        time.sleep(0.7)  # past the first lease: kept alive

    stats = consumer.run(slow, max_items=1)
    assert (stats.released, stats.lost) == (1, 0)


def test_async_jobs_keep_their_leases_without_a_task_per_quick_job(
    server: LiveServer, queue: str
) -> None:
    async def run() -> None:
        async with AsyncClient(server.url) as dq:
            await dq.enqueue_many(queue, [b"quick", b"slow"])
            others: list[Item] = []

            async def handler(item: Item) -> None:
                if item.value == b"quick":
                    coros = [t.get_coro() for t in asyncio.all_tasks()]
                    assert "AsyncJob._keep" not in [getattr(c, "__qualname__", "") for c in coros]
                    return
                give_up = time.monotonic() + 2.5  # two and a half lease lengths
                while time.monotonic() < give_up:
                    others.extend(await dq.dequeue(queue))  # nobody else may get it
                    await asyncio.sleep(0.1)

            stats = await dq.consumer(queue, lease_ms=1_000, wait_ms=500).run(handler, max_items=2)
            assert others == [] and (stats.released, stats.lost) == (2, 0)
            assert (await dq.queue(queue)).stats.pending == 0

    asyncio.run(asyncio.wait_for(run(), 30))


def test_a_forked_child_starts_lease_keepers_of_its_own() -> None:
    """After fork() the child's starter has no thread (it stayed in the parent), a lock
    of its own, and none of the parent's jobs (the parent keeps those)."""
    from dq.client import jobs

    parents_job = object()
    jobs._starter.add(parents_job, time.monotonic() + 3600)  # type: ignore[arg-type]
    try:
        assert jobs._starter._thread is not None
        pid = os.fork()
        if pid == 0:
            ok = jobs._starter._thread is None and not jobs._starter._jobs
            jobs._starter.remove(parents_job)  # type: ignore[arg-type]
            os._exit(0 if ok else 1)
        give_up = time.monotonic() + 10
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < give_up
            time.sleep(0.01)
        assert os.waitstatus_to_exitcode(done[1]) == 0
        assert id(parents_job) in jobs._starter._jobs  # the parent's starter is untouched
    finally:
        jobs._starter.remove(parents_job)  # type: ignore[arg-type]
