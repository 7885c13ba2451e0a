"""A real engine (fsync=always) driven as a leader by the Replicator, a follower played
by the test through ``Replicator.pull``: a write is answered, and visible to dequeue,
only once a counted follower has acknowledged it; a write that waits too long answers
ReplicationTimeout and still publishes when the acknowledgement comes; the window bound
detaches a follower that is too far behind; the frames carry the engine's records."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dq.server.replication.leader import Refused, Replicator
from dq.storage import Engine, EngineConfig
from dq.storage.errors import ReplicationStalled
from dq.storage.replication import KIND_CONTROL, KIND_RECORD, ReplicationTimeout, decode_frames
from dq.storage.types import NewItem, Release
from tests.replication.members import Members

T = TypeVar("T")


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    e = Engine.open(tmp_path / "data", EngineConfig(fsync="always"))
    try:
        e.ensure_queue("q")
        yield e
    finally:
        e.set_replication(None)
        e.close()


def lead(
    engine: Engine,
    body: Callable[[Replicator, Members], Awaitable[T]],
    **options: Any,
) -> T:
    """Run ``body`` with ``engine`` leading through a started replicator (epoch 3)."""

    async def go() -> T:
        members = Members()
        options.setdefault("min_insync", 2)
        rep = Replicator(
            engine, node="n1", epoch=3, coordinator=members, step_down=lambda r: None, **options
        )
        await rep.start()
        engine.set_replication(rep)
        try:
            return await asyncio.wait_for(body(rep, members), 60)
        finally:
            engine.set_replication(None)
            await rep.stop()

    return asyncio.run(go())


async def join(rep: Replicator, node: str = "f1") -> int:
    """Attach ``node`` as a snapshot would and have it acknowledged and counted."""
    start = rep.attach(node)
    await rep.pull(node, rep.epoch, start, 0)
    await rep.upkeep()
    assert rep.followers()[node].in_sync
    return start


async def settled(fut: Future[Any], timeout: float = 10.0) -> None:
    await asyncio.wait_for(asyncio.wrap_future(fut), timeout)


def enqueue(engine: Engine, value: bytes) -> Future[Any]:
    return engine.enqueue_nowait("q", [NewItem(value)])


def test_an_enqueue_is_answered_and_dequeued_only_after_the_follower_acks_it(
    engine: Engine,
) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        await join(rep)
        fut = enqueue(engine, b"hello")
        await asyncio.sleep(0.3)  # the local fsync is long done; the follower has not acked
        assert not fut.done()
        assert engine.dequeue("q", 10) == []
        pulled = await rep.pull("f1", 3, 0, 1000)
        frames = decode_frames(pulled.body)
        assert [f.queue for f in frames] == ["q"]
        assert b"hello" in frames[0].payload
        assert not fut.done()
        assert engine.dequeue("q", 10) == []
        await rep.pull("f1", 3, frames[-1].lsn, 0)  # the acknowledgement
        await settled(fut)
        [item] = fut.result()
        [got] = engine.dequeue("q", 10)
        assert (got.id, got.value) == (item.id, b"hello")
        assert rep.commit_lsn == frames[-1].lsn

    lead(engine, body)


def test_a_write_waiting_past_the_commit_timeout_answers_replication_timeout_and_publishes_later(
    engine: Engine,
) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        await join(rep)
        t0 = time.monotonic()  # before: the write's commit timeout starts as it is appended
        fut = enqueue(engine, b"late")
        with pytest.raises(ReplicationTimeout):
            await settled(fut)
        assert 0.25 <= time.monotonic() - t0 < 5.0
        assert engine.dequeue("q", 10) == []
        pulled = await rep.pull("f1", 3, 0, 0)
        last = decode_frames(pulled.body)[-1].lsn
        await rep.pull("f1", 3, last, 0)
        give_up = time.monotonic() + 10
        got: list[Any] = []
        while not got:
            assert time.monotonic() < give_up, "the committed item never became visible"
            await asyncio.sleep(0.02)
            got = engine.dequeue("q", 10)
        assert [d.value for d in got] == [b"late"]

    lead(engine, body, commit_timeout_s=0.3)


def test_below_min_insync_nothing_commits(engine: Engine) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        fut = enqueue(engine, b"alone")
        with pytest.raises(ReplicationTimeout):
            await settled(fut)
        assert rep.commit_lsn == 0
        assert engine.dequeue("q", 10) == []

    lead(engine, body, commit_timeout_s=0.3, min_insync=2)


def test_a_lone_leader_with_min_insync_one_commits_on_its_own_fsync(engine: Engine) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        fut = enqueue(engine, b"solo")
        await settled(fut)
        assert [d.value for d in engine.dequeue("q", 10)] == [b"solo"]
        assert rep.commit_lsn == rep.last_lsn >= 1

    lead(engine, body, min_insync=1)


def test_control_ops_and_releases_are_shipped_in_log_order(engine: Engine) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        await join(rep)
        await asyncio.to_thread(engine.ensure_queue, "other")
        fut = enqueue(engine, b"a")
        pulled = await rep.pull("f1", 3, 0, 1000)
        await rep.pull("f1", 3, decode_frames(pulled.body)[-1].lsn, 0)
        await settled(fut)
        [d] = engine.dequeue("q", 1)
        done = engine.release_nowait("q", [Release(d.id, d.receipt)])
        frames: list[Any] = []
        after = rep.followers()["f1"].acked
        give_up = time.monotonic() + 10
        while not done.done():
            assert time.monotonic() < give_up
            pulled = await rep.pull("f1", 3, after, 200)
            got = decode_frames(pulled.body)
            frames.extend(got)
            if got:
                after = got[-1].lsn
        lsns = [f.lsn for f in frames]
        assert lsns == sorted(lsns)
        assert any(f.queue == "q" and f.kind != KIND_CONTROL for f in frames)
        await settled(done)

    lead(engine, body)


def test_the_window_bound_detaches_a_follower_that_stopped_pulling(engine: Engine) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        await join(rep, "f1")
        rep.attach("slow")
        futs = [enqueue(engine, b"x" * 1000) for _ in range(40)]
        after = 0
        while not all(f.done() for f in futs):
            pulled = await rep.pull("f1", 3, after, 200)
            if pulled.body:
                after = decode_frames(pulled.body)[-1].lsn
        await rep.upkeep()
        assert "slow" not in rep.followers()
        with pytest.raises(Refused) as detached:
            await rep.pull("slow", 3, 0, 0)
        assert detached.value.code == "resync_needed"
        assert members.calls == [("add", "f1")]

    lead(engine, body, window_bytes=8000, min_insync=2)


def test_ship_runs_on_storage_threads_while_pulls_wait_on_the_loop(engine: Engine) -> None:
    """Writers on several threads, one follower pulling with waits: every write commits."""

    async def body(rep: Replicator, members: Members) -> int:
        await join(rep)
        futs: list[Future[Any]] = []
        lock = threading.Lock()

        def write(n: int) -> None:
            for i in range(n):
                f = enqueue(engine, f"v{i}".encode())
                with lock:
                    futs.append(f)

        writers = [threading.Thread(target=write, args=(50,)) for _ in range(4)]
        for t in writers:
            t.start()
        after = 0
        give_up = time.monotonic() + 30
        while True:
            assert time.monotonic() < give_up, "writes did not commit"
            pulled = await rep.pull("f1", 3, after, 100)
            if pulled.body:
                frames = decode_frames(pulled.body)
                assert frames[0].lsn == after + 1
                after = frames[-1].lsn
            with lock:
                finished = len(futs) == 200 and all(f.done() for f in futs)
            if finished:
                break
        for t in writers:
            t.join(10)
        for f in futs:
            f.result()
        return len(engine.dequeue("q", 1000))

    assert lead(engine, body) == 200


def test_a_replicator_the_engine_no_longer_ships_to_commits_nothing(engine: Engine) -> None:
    async def body(rep: Replicator, members: Members) -> None:
        old = Replicator(
            engine,
            node="n1",
            epoch=2,
            coordinator=members,
            step_down=lambda r: None,
            min_insync=1,
        )
        await old.start()
        try:
            for _ in range(100):
                old.ship("q", KIND_RECORD, b"")  # its commit lsn is 100 now
            assert old.commit_lsn == 100
            fut = enqueue(engine, b"new epoch")  # lsn 1 of the current replicator
            await asyncio.sleep(0.3)
            assert not fut.done()
            assert engine.commit_lsn == 0
            assert engine.dequeue("q", 10) == []
        finally:
            await old.stop()

    lead(engine, body, commit_timeout_s=5.0)


def test_a_group_that_acknowledges_nothing_for_a_commit_timeout_refuses_new_writes(
    engine: Engine,
) -> None:
    """Back-pressure: once the follower has acknowledged nothing for a whole commit
    timeout while writes wait, new writes are refused before anything is written
    (replication_stalled, a definite 503); they are taken again once it acknowledges."""

    async def body(rep: Replicator, members: Members) -> None:
        await join(rep)
        waiting = enqueue(engine, b"in doubt")
        await asyncio.sleep(0.5)  # two commit timeouts without an acknowledgement
        with pytest.raises(ReplicationTimeout):
            waiting.result(timeout=5)
        shipped = rep.last_lsn
        with pytest.raises(ReplicationStalled):
            enqueue(engine, b"refused")
        assert rep.last_lsn == shipped  # nothing shipped, nothing written
        await rep.pull("f1", 3, shipped, 0)  # the follower is back and acknowledges
        fut = enqueue(engine, b"taken")
        pulled = await rep.pull("f1", 3, shipped, 1000)
        await rep.pull("f1", 3, decode_frames(pulled.body)[-1].lsn, 0)
        await settled(fut)
        assert sorted(d.value for d in engine.dequeue("q", 10)) == [b"in doubt", b"taken"]

    lead(engine, body, commit_timeout_s=0.2)
