"""The Replicator's own bookkeeping, with a recording engine and a fake coordinator:
lsns, pulls and acknowledgements, commit_lsn, the sync set's order of operations, the
window bound, waking pulls from other threads, stepping down.

The tests against a real engine (publishing waits for the commit) are in
test_leader_engine.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from dq.server.replication import leader
from dq.server.replication.leader import MAX_PULL_BYTES, Refused, Replicator, _frame
from dq.storage.replication import KIND_CONTROL, KIND_RECORD, Frame, decode_frames, encode_frame

T = TypeVar("T")


class RecordingEngine:
    """Only what the replicator calls: ``commit``."""

    def __init__(self) -> None:
        self.commits: list[int] = []
        self.lock = threading.Lock()

    def commit(self, lsn: int, sink: object = None) -> None:
        with self.lock:
            self.commits.append(lsn)

    def last(self) -> int:
        with self.lock:
            return self.commits[-1] if self.commits else -1


class FakeCoordinator:
    """Records each call with whether the replicator counted the node at that moment."""

    def __init__(self) -> None:
        self.rep: Replicator | None = None
        self.calls: list[tuple[str, str, bool]] = []
        self.answer: dict[str, object] = {"add": True, "remove": True}

    def _counted(self, node: str) -> bool:
        assert self.rep is not None
        f = self.rep.followers().get(node)
        return f is not None and f.in_sync

    async def add_member(self, node: str) -> bool:
        self.calls.append(("add", node, self._counted(node)))
        return self._answer("add")

    async def remove_member(self, node: str) -> bool:
        self.calls.append(("remove", node, self._counted(node)))
        return self._answer("remove")

    def _answer(self, op: str) -> bool:
        a = self.answer[op]
        if isinstance(a, BaseException):
            raise a
        assert isinstance(a, bool)
        return a


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(
    body: Callable[[Replicator, RecordingEngine, FakeCoordinator], Awaitable[T]],
    **options: Any,
) -> T:
    """Run ``body`` with a started replicator (epoch 5, node "n1") and stop it after."""

    async def go() -> T:
        engine = RecordingEngine()
        coord = FakeCoordinator()
        options.setdefault("step_down", lambda reason: None)
        rep = Replicator(engine, node="n1", epoch=5, coordinator=coord, **options)  # type: ignore[arg-type]
        coord.rep = rep
        await rep.start()
        try:
            return await asyncio.wait_for(body(rep, engine, coord), 30)
        finally:
            await rep.stop()

    return asyncio.run(go())


async def eventually(check: Callable[[], bool], timeout: float = 5.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "condition not reached in time"
        await asyncio.sleep(0.01)


def ship(rep: Replicator, n: int, queue: str = "q", size: int = 10) -> list[int]:
    return [rep.ship(queue, KIND_RECORD, bytes([i % 256]) * size) for i in range(n)]


def test_lsns_count_up_and_a_pull_answers_the_frames_after_its_ack() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        start = rep.attach("f1")
        assert start == 0
        assert ship(rep, 3) == [1, 2, 3]
        rep.ship("other", KIND_RECORD, b"x")
        pulled = await rep.pull("f1", 5, 0, 0)
        frames = decode_frames(pulled.body)
        assert [(f.lsn, f.queue) for f in frames] == [(1, "q"), (2, "q"), (3, "q"), (4, "other")]
        assert frames[1].payload == b"\x01" * 10
        assert (pulled.epoch, pulled.last_lsn) == (5, 4)
        pulled = await rep.pull("f1", 5, 2, 0)
        assert [f.lsn for f in decode_frames(pulled.body)] == [3, 4]
        assert rep.followers()["f1"].acked == 2
        assert rep.window()[0] == 3  # frames 1 and 2 are acknowledged by every follower
        assert (await rep.pull("f1", 5, 4, 0)).body == b""

    run(body)


def test_pulls_that_cannot_be_served_are_refused_with_the_wire_codes() -> None:
    reasons: list[str] = []

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        ship(rep, 2)
        with pytest.raises(Refused) as unknown:
            await rep.pull("stranger", 5, 0, 0)
        assert unknown.value.code == "resync_needed"
        rep.attach("f1")
        with pytest.raises(Refused) as ahead:
            await rep.pull("f1", 5, 9, 0)
        assert ahead.value.code == "resync_needed"
        with pytest.raises(Refused) as older:
            await rep.pull("f1", 4, 2, 0)
        assert older.value.code == "resync_needed"
        await rep.pull("f1", 5, 2, 0)
        with pytest.raises(Refused) as backwards:
            await rep.pull("f1", 5, 1, 0)
        assert backwards.value.code == "resync_needed"
        assert reasons == []
        with pytest.raises(Refused) as newer:
            await rep.pull("f1", 6, 2, 0)
        assert newer.value.code == "stale_leader"
        with pytest.raises(Refused):
            rep.check_epoch(7)
        await eventually(lambda: len(reasons) == 1)
        assert "epoch 6" in reasons[0]

    run(body, step_down=reasons.append)


def test_snapshot_attach_keeps_frames_after_its_lsn_and_a_pull_acks_them() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        ship(rep, 5)
        assert rep.window()[:2] == (6, 5)  # nobody attached: nothing is kept
        start = rep.attach("f1")
        assert start == 5
        ship(rep, 2)
        with pytest.raises(Refused):
            await rep.pull("f1", 5, 4, 0)  # below what the window holds
        pulled = await rep.pull("f1", 5, 5, 0)
        assert [f.lsn for f in decode_frames(pulled.body)] == [6, 7]

    run(body)


def test_commit_waits_for_counted_followers_and_only_at_min_insync() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        rep.attach("f2")
        ship(rep, 3)
        await rep.upkeep()
        assert coord.calls == []  # no pull has acknowledged anything yet
        await rep.pull("f1", 5, 0, 0)
        await rep.upkeep()
        assert coord.calls == [("add", "f1", True)]  # counted before the add
        assert rep.commit_lsn == 0
        await rep.pull("f1", 5, 2, 0)
        assert rep.commit_lsn == 2
        await eventually(lambda: engine.last() == 2)
        await rep.pull("f2", 5, 1, 0)
        await rep.upkeep()  # f2 is behind commit_lsn: not added
        assert [c[1] for c in coord.calls] == ["f1"]
        await rep.pull("f2", 5, 3, 0)
        await rep.upkeep()
        assert coord.calls[-1] == ("add", "f2", True)
        assert rep.commit_lsn == 2  # f1 has 2, f2 has 3
        await rep.pull("f1", 5, 3, 0)
        assert rep.commit_lsn == 3
        status = rep.status()
        assert status["sync"] == ["n1", "f1", "f2"]
        assert status["followers"] == {
            "f1": {"acked": 3, "in_sync": True},
            "f2": {"acked": 3, "in_sync": True},
        }

    run(body, min_insync=2)


def test_with_min_insync_one_and_no_follower_every_ship_commits() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        ship(rep, 4)
        assert rep.commit_lsn == 4
        await eventually(lambda: engine.last() == 4)

    run(body, min_insync=1)


def test_the_tick_calls_commit_without_any_acknowledgement() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        ship(rep, 1)
        await asyncio.sleep(0.3)
        assert rep.commit_lsn == 0
        assert len(engine.commits) >= 3
        assert set(engine.commits) == {0}

    run(body, min_insync=2)


def test_a_refused_add_stops_counting_and_an_unknown_one_is_retried() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        ship(rep, 2)
        await rep.pull("f1", 5, 2, 0)
        coord.answer["add"] = False
        await rep.upkeep()
        f = rep.followers()["f1"]
        assert (f.in_sync, f.member) == (False, False)
        coord.answer["add"] = TimeoutError("etcd did not answer")
        await rep.upkeep()
        f = rep.followers()["f1"]
        assert (f.in_sync, f.member) == (True, None)  # maybe a member: still counted
        coord.answer["add"] = True
        await rep.upkeep()
        f = rep.followers()["f1"]
        assert (f.in_sync, f.member) == (True, True)
        assert [c[0] for c in coord.calls] == ["add", "add", "add"]
        assert all(c[2] for c in coord.calls)

    run(body, min_insync=2)


def test_a_silent_member_leaves_the_sync_set_before_it_stops_being_counted() -> None:
    clock = Clock()

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        for node in ("f1", "f2"):
            rep.attach(node)
        ship(rep, 2)
        for node in ("f1", "f2"):
            await rep.pull(node, 5, 2, 0)
        await rep.upkeep()
        assert [c[:2] for c in coord.calls] == [("add", "f1"), ("add", "f2")]
        ship(rep, 2)
        clock.now += 1.5
        await rep.pull("f1", 5, 4, 0)
        assert rep.commit_lsn == 2  # f2 holds it back
        clock.now += 1.0  # f2 silent for 2.5 s
        await rep.upkeep()
        assert coord.calls[-1] == ("remove", "f2", True)  # still counted while removed
        f2 = rep.followers()["f2"]
        assert (f2.in_sync, f2.member) == (False, False)
        assert rep.commit_lsn == 4
        clock.now += 5.0  # f1 silent too, but it is the last one: min_insync holds it
        await rep.upkeep()
        assert [c[0] for c in coord.calls].count("remove") == 1
        assert rep.followers()["f1"].in_sync
        # a removal that fails keeps the member counted
        coord.answer["remove"] = False
        rep.attach("f3")
        await rep.pull("f3", 5, 4, 0)
        await rep.pull("f1", 5, 4, 0)
        await rep.upkeep()
        assert coord.calls[-1] == ("add", "f3", True)
        clock.now += 5.0
        await rep.upkeep()
        assert ("remove", "f1", True) in coord.calls
        assert rep.followers()["f1"].in_sync

    run(body, min_insync=2, replica_timeout_s=2.0, clock=clock)


def test_the_window_bound_detaches_the_laggiest_follower() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("slow")
        rep.attach("fast")
        ship(rep, 30, size=100)  # about 3.4 KB
        await rep.pull("fast", 5, 30, 0)
        assert rep.window()[2] > 2000
        await rep.upkeep()  # "fast" is added (commit 0 <= 30), "slow" never pulled
        assert "slow" not in rep.followers()
        assert rep.window() == (31, 30, 0)
        with pytest.raises(Refused) as detached:
            await rep.pull("slow", 5, 0, 0)
        assert detached.value.code == "resync_needed"

    run(body, window_bytes=2000, min_insync=1)


def test_a_laggy_member_is_removed_from_the_sync_set_before_it_is_detached() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        for node in ("f1", "f2"):
            rep.attach(node)
            await rep.pull(node, 5, 0, 0)
        await rep.upkeep()
        assert [c[0] for c in coord.calls] == ["add", "add"]
        ship(rep, 30, size=100)
        await rep.pull("f2", 5, 30, 0)
        await rep.upkeep()
        assert coord.calls[-1] == ("remove", "f1", True)
        assert "f1" not in rep.followers()
        assert rep.window()[2] == 0
        assert rep.commit_lsn == 30

    run(body, window_bytes=2000, min_insync=2)


def test_a_laggy_member_at_min_insync_stays_and_the_window_grows() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        await rep.pull("f1", 5, 0, 0)
        await rep.upkeep()
        ship(rep, 30, size=100)
        await rep.upkeep()
        assert [c[0] for c in coord.calls] == ["add"]
        assert "f1" in rep.followers()
        assert rep.window()[2] > 2000

    run(body, window_bytes=2000, min_insync=2)


def test_a_waiting_pull_is_woken_by_a_ship_from_another_thread() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> float:
        rep.attach("f1")
        shipped: list[float] = []

        def later() -> None:
            shipped.append(time.monotonic())
            ship(rep, 1)

        timer = threading.Timer(0.1, later)
        timer.start()
        try:
            pulled = await rep.pull("f1", 5, 0, 1000)
        finally:
            timer.join(5)
        assert [f.lsn for f in decode_frames(pulled.body)] == [1]
        return time.monotonic() - shipped[0]

    # woken, not answered at the end of its wait (which is ~0.9 s after the ship)
    assert run(body) < 0.6


def test_an_idle_pull_answers_empty_after_its_wait() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> float:
        rep.attach("f1")
        t0 = time.monotonic()
        pulled = await rep.pull("f1", 5, 0, 150)
        assert pulled.body == b""
        return time.monotonic() - t0

    assert 0.14 < run(body) < 1.0


def test_stop_ends_a_waiting_pull_with_not_leader() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        waiting = asyncio.create_task(rep.pull("f1", 5, 0, 1000))
        await asyncio.sleep(0.05)
        await rep.stop()
        with pytest.raises(Refused) as ended:
            await waiting
        assert ended.value.code == "not_leader"

    run(body)


def test_a_pull_answers_about_four_mib_at_most() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        ship(rep, 10, size=1 << 20)
        pulled = await rep.pull("f1", 5, 0, 0)
        lsns = [f.lsn for f in decode_frames(pulled.body)]
        assert lsns == [1, 2, 3]
        assert len(pulled.body) <= MAX_PULL_BYTES
        big = rep.ship("q", KIND_RECORD, b"z" * (5 << 20))
        pulled = await rep.pull("f1", 5, 10, 0)
        assert [f.lsn for f in decode_frames(pulled.body)] == [big]  # one frame at least

    run(body, window_bytes=1 << 30)


def test_trimming_many_frames_keeps_lsns_and_bytes_right() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        ship(rep, 10_000, size=3)
        for after in (0, 4_999, 9_000, 9_998):
            pulled = await rep.pull("f1", 5, after, 0)
            first = decode_frames(pulled.body)[0].lsn
            assert first == after + 1
            assert rep.window()[0] == after + 1
        held = rep.window()[2]
        assert held == len((await rep.pull("f1", 5, 9_998, 0)).body)

    run(body)


def test_local_failure_on_a_storage_thread_steps_down_on_the_loop() -> None:
    seen: list[tuple[str, int]] = []

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        t = threading.Thread(
            target=lambda: [rep.local_failure("q", OSError(5, "EIO")) for _ in range(3)]
        )
        t.start()
        t.join(5)
        await eventually(lambda: len(seen) == 1)
        assert "queue q failed" in seen[0][0]
        assert seen[0][1] == threading.get_ident()

    run(body, step_down=lambda reason: seen.append((reason, threading.get_ident())))


@pytest.mark.parametrize(
    ("lsn", "queue", "kind", "payload"),
    [
        (1, "q", KIND_RECORD, b""),
        (2**40 + 7, "a" * 128, KIND_CONTROL, b'{"op":"delete_queue"}'),
        (99, "emails.v2_x-y", KIND_RECORD, bytes(range(256)) * 300),
    ],
)
def test_shipped_frames_are_byte_for_byte_encode_frame(
    lsn: int, queue: str, kind: int, payload: bytes
) -> None:
    assert _frame(lsn, queue.encode(), kind, payload) == encode_frame(
        Frame(lsn, queue, kind, payload)
    )


def test_a_member_taking_a_snapshot_again_leaves_the_sync_set_until_it_caught_up() -> None:
    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        for node in ("f1", "f2"):
            rep.attach(node)
            await rep.pull(node, 5, 0, 0)
        await rep.upkeep()
        assert [c[:2] for c in coord.calls] == [("add", "f1"), ("add", "f2")]
        ship(rep, 3)
        await rep.pull("f1", 5, 3, 0)
        await rep.pull("f2", 5, 3, 0)
        assert rep.commit_lsn == 3
        start = rep.attach("f2")  # f2 restarted: its data is being replaced
        assert start == 3
        await rep.upkeep()
        assert coord.calls[-1] == ("remove", "f2", True)
        f2 = rep.followers()["f2"]
        assert (f2.in_sync, f2.member, f2.resyncing) == (False, False, True)
        await rep.upkeep()  # not added back before it has pulled
        assert len(coord.calls) == 3
        await rep.pull("f2", 5, start, 0)
        await rep.upkeep()
        assert coord.calls[-1] == ("add", "f2", True)

    run(body, min_insync=2)


def test_the_follower_that_completes_min_insync_commits_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(leader, "TICK_S", 60.0)  # engine.commit only when told

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        rep.attach("f1")
        ship(rep, 4)
        await rep.pull("f1", 5, 4, 0)
        assert rep.commit_lsn == 0  # nobody counted: below min_insync
        assert engine.commits == []
        await rep.upkeep()
        assert rep.commit_lsn == 4
        await eventually(lambda: engine.last() == 4)

    run(body, min_insync=2)


def test_writes_are_refused_up_front_while_commits_are_stalled() -> None:
    clock = Clock()

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        assert rep.admits_writes()
        ship(rep, 2)  # below min_insync: nothing commits
        clock.now += 9.0
        assert rep.admits_writes()  # not yet a commit timeout
        clock.now += 2.0
        assert not rep.admits_writes()
        rep.attach("f1")
        await rep.pull("f1", 5, 2, 0)
        await rep.upkeep()  # counted: commit_lsn moves to 2
        assert rep.commit_lsn == 2
        assert rep.admits_writes()
        ship(rep, 1)
        clock.now += 5.0
        await rep.pull("f1", 5, 2, 0)  # alive, but lsn 3 does not commit
        assert rep.admits_writes()
        clock.now += 6.0
        assert not rep.admits_writes()
        await rep.pull("f1", 5, 3, 0)
        assert rep.admits_writes()

    run(body, min_insync=2, commit_timeout_s=10.0, clock=clock)


def test_a_leader_idle_for_longer_than_a_commit_timeout_admits_its_next_write() -> None:
    """The stall is measured from the first frame left waiting, not from the last
    commit: a group idle for minutes is not 'stalled' when a write finally comes."""
    clock = Clock()

    async def body(rep: Replicator, engine: RecordingEngine, coord: FakeCoordinator) -> None:
        clock.now += 600.0  # elected, then nothing to do for ten minutes
        ship(rep, 1)  # a queue's creation waits for the followers
        assert rep.admits_writes()  # so the enqueue right behind it is taken
        clock.now += 11.0
        assert not rep.admits_writes()  # now it has waited a whole commit timeout

    run(body, min_insync=2, commit_timeout_s=10.0, clock=clock)
