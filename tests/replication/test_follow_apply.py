"""Log shipping end to end, without etcd: a leader server and its followers.

The leader is the real server (uvicorn with dq's protocol, in a thread of this process)
whose engine leads through a ``Replicator`` with a fixed sync-set keeper; the follower is
the server's ``Follower`` over a real engine, in this process or in a process of its own
(``follower_proc.py``) when the test kills it. What a follower holds is compared with the
leader item by item (id, deadline, value), queue by queue (config, pause, next id), on the
live engine and again on its data directory reopened after it stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from dq.server.replication.follower import Follower
from dq.server.replication.leader import Replicator
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig, NewItem, Release, Requeue
from dq.storage.errors import NotLeader, ReplicationTimeout
from dq.storage.replication import Frame, decode_frames
from dq.storage.types import QueueConfig
from tests.replication.fake_leader import FakeLeader
from tests.replication.inproc import InProcessServer, in_process_server

pytestmark = pytest.mark.integration  # leaders served over HTTP, followers as processes

TOKEN = "s3cret"
EPOCH = 3
REPO = Path(__file__).resolve().parents[2]


class StaticNode:
    """What the routes read of the role machine: this node leads, statically."""

    def __init__(self, url: str) -> None:
        self.url = url

    def describe(self) -> dict[str, Any]:
        return {
            "node": "n1",
            "role": "leader",
            "epoch": EPOCH,
            "leader": {"node": "n1", "url": self.url},
        }


class FixedSyncSet:
    """The sync set kept in memory instead of etcd: every change is accepted."""

    def __init__(self) -> None:
        self.members = {"n1"}

    async def add_member(self, node: str) -> bool:
        self.members.add(node)
        return True

    async def remove_member(self, node: str) -> bool:
        self.members.discard(node)
        return True


@dataclass
class Leader:
    server: InProcessServer
    engine: Engine
    rep: Replicator
    data: Path
    sync: FixedSyncSet
    step_downs: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def acked(self, node: str) -> int:
        state = self.rep.followers().get(node)
        return -1 if state is None else state.acked


@contextlib.contextmanager
def leading(
    tmp_path: Path,
    min_insync: int,
    window_bytes: int = 256 << 20,
    config: EngineConfig | None = None,
) -> Iterator[Leader]:
    data = tmp_path / "leader"
    engine = Engine.open(data, config or EngineConfig(fsync="always"))
    settings = Settings(data_dir=str(data), fsync="always", tokens=(TOKEN,), shm=False)
    try:
        with in_process_server(settings, engine) as server:
            sync = FixedSyncSet()
            steps: list[str] = []
            rep = Replicator(
                engine,
                node="n1",
                epoch=EPOCH,
                coordinator=sync,
                step_down=steps.append,
                min_insync=min_insync,
                replica_timeout_s=0.5,
                commit_timeout_s=10.0,
                window_bytes=window_bytes,
            )
            server.call(rep.start)
            engine.set_replication(rep)
            server.app.state.node = StaticNode(server.url)
            server.app.state.replicator = rep
            try:
                yield Leader(server, engine, rep, data, sync, steps)
            finally:
                server.app.state.replicator = None
                engine.set_replication(None)
                server.call(rep.stop)
    finally:
        engine.close()


@pytest.fixture
def leader(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Leader]:
    min_insync = getattr(request, "param", 2)
    with leading(tmp_path, min_insync) as lead:
        yield lead


@dataclass
class InProcessFollower:
    engine: Engine
    follower: Follower
    data: Path
    reports: list[tuple[str, str]]

    @property
    def disk(self) -> SlowDisk:
        disk = self.follower._engine
        assert isinstance(disk, SlowDisk)
        return disk

    def stop(self) -> None:
        self.follower.stop(timeout=20)
        self.engine.close()


class SlowDisk:
    """The follower's engine, with applies that wait while ``gate`` is closed."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = threading.Event()

    def set_role(self, writable: bool, leader: str | None) -> None:
        self.engine.set_role(writable, leader)

    def replace_queues(self, src_dir: str) -> None:
        self.engine.replace_queues(src_dir)

    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]:
        if not self.gate.is_set():
            self.waiting.set()
            assert self.gate.wait(60)
        return self.engine.apply(frames, stopping)


@contextlib.contextmanager
def following(
    leader: Leader, data: Path, node: str = "f1", slow: bool = False
) -> Iterator[InProcessFollower]:
    engine = Engine.open(data, EngineConfig(fsync="always"))
    reports: list[tuple[str, str]] = []
    follower = Follower(
        SlowDisk(engine) if slow else engine,
        str(data),
        node,
        token=TOKEN,
        report=lambda code, message: reports.append((code, message)),
        wait_ms=200,
        backoff_s=(0.02, 0.2),
    )
    f = InProcessFollower(engine, follower, data, reports)
    try:
        follower.follow(leader.url, EPOCH, leader_node="n1")
        yield f
    finally:
        f.stop()


class FollowerProcess:
    """``follower_proc.py`` in a process of its own; ``kill`` is SIGKILL."""

    def __init__(self, data: Path, url: str, node: str = "f1") -> None:
        self.data = data
        self.log = data.parent / f"{node}.log"
        self.args = [sys.executable, "-m", "tests.replication.follower_proc", str(data), node, url, str(EPOCH), TOKEN]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> FollowerProcess:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)
        wait_for(lambda: b"FOLLOWING" in self.log.read_bytes() or self.proc.poll() is not None)  # type: ignore[union-attr]
        assert self.proc.poll() is None, self.log.read_text()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(30)
        finally:
            self.kill()


def wait_for(check: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    give_up = time.monotonic() + timeout
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"timed out waiting for {what or check}")
        time.sleep(0.02)


def contents(engine: Engine) -> dict[str, Any]:
    """Every queue's config, pause, next id and items (id, deadline, value)."""
    out: dict[str, Any] = {}
    for name in sorted(engine.list_queues()):
        stats = engine.stats(name)
        items: list[tuple[int, int | None, bytes | None]] = []
        cursor: str | None = None
        while True:
            page = engine.browse(name, "all", cursor, limit=1000, with_values=True)
            items += [(i.id, i.deadline, i.value) for i in page.items]
            if page.next is None:
                break
            cursor = page.next
        out[name] = {
            "config": stats.config,
            "paused": stats.paused,
            "next_id": stats.next_id,
            "items": sorted(items),
        }
    return out


def reopened(data: Path) -> dict[str, Any]:
    with Engine.open(data, EngineConfig(fsync="always")) as engine:
        return contents(engine)


def caught_up(leader: Leader, node: str = "f1") -> bool:
    return leader.acked(node) == leader.rep.last_lsn


class Writer:
    """A write load on the leader: enqueues, and dequeues then releases or requeues."""

    def __init__(self, engine: Engine, queue: str = "load") -> None:
        self.engine, self.queue = engine, queue
        self.acked: list[int] = []
        self.errors: list[BaseException] = []
        self.unknown = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-writer", daemon=True)

    def start(self) -> Writer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive()

    def wait_acked(self, n: int) -> None:
        wait_for(lambda: len(self.acked) >= n or bool(self.errors), what=f"{n} enqueues")
        assert not self.errors, self.errors

    def _run(self) -> None:
        rng = random.Random(7)
        n = 0
        while not self._stop.is_set():
            try:
                batch = [NewItem(b"v%d" % (n + i)) for i in range(rng.randint(1, 20))]
                n += len(batch)
                self.acked += [e.id for e in self.engine.enqueue(self.queue, batch)]
                for d in self.engine.dequeue(self.queue, rng.randint(1, 5), lease_ms=60_000):
                    if rng.random() < 0.7:
                        self.engine.release(self.queue, [Release(d.id, d.receipt)])
                    else:
                        self.engine.requeue(
                            self.queue, [Requeue(d.id, d.receipt, delay_ms=rng.randint(0, 10**6))]
                        )
            except ReplicationTimeout:
                self.unknown += 1  # a follower was away and not yet out of the sync set
            except BaseException as exc:
                self.errors.append(exc)
                return


# -- the tests ----------------------------------------------------------------------


def test_every_acknowledged_enqueue_is_already_on_the_follower(
    leader: Leader, tmp_path: Path
) -> None:
    with following(leader, tmp_path / "f1") as f:
        wait_for(lambda: "f1" in leader.sync.members and leader.rep.followers()["f1"].in_sync)
        for batch in range(20):
            items = [NewItem(b"item-%d-%d" % (batch, i), delay_ms=1000 * i) for i in range(25)]
            ids = [e.id for e in leader.engine.enqueue("q", items)]
            # committed means fsynced on the follower and applied: visible there at once
            seen = {i.id for i in f.engine.browse("q", "all", None, limit=1000).items}
            assert set(ids) <= seen
        assert f.engine.stats("q").pending == 500
        assert contents(f.engine) == contents(leader.engine)
        with pytest.raises(NotLeader) as refused:
            f.engine.enqueue("q", [NewItem(b"direct")])
        assert refused.value.leader == leader.url
        status = f.follower.status().as_json()
        assert status["state"] == "streaming" and status["epoch"] == EPOCH
        assert status["leader"] == {"node": "n1", "url": leader.url} and status["resyncs"] == 1
        assert status["lsn"] == leader.rep.last_lsn and f.reports == []
    assert reopened(tmp_path / "f1") == contents(leader.engine)
    assert json.loads((tmp_path / "f1" / "replica.json").read_text()) == {"epoch": EPOCH}


@pytest.mark.parametrize("leader", [1], indirect=True)  # alone at first: "before" commits
def test_every_kind_of_change_replicates(leader: Leader, tmp_path: Path) -> None:
    e = leader.engine
    e.enqueue("before", [NewItem(b"in the snapshot %d" % i) for i in range(10)])
    with following(leader, tmp_path / "f1") as f:
        wait_for(lambda: "f1" in leader.sync.members)
        e.put_queue(
            "jobs", QueueConfig(default_lease_ms=5000, max_deliveries=3, dead_letter_queue="dead")
        )
        e.put_queue("dead", QueueConfig())
        ids = [x.id for x in e.enqueue("jobs", [NewItem(b"job %d" % i) for i in range(30)])]
        got = e.dequeue("jobs", 10, lease_ms=60_000)
        assert len(got) == 10
        e.release("jobs", [Release(d.id, d.receipt) for d in got[:4]])
        e.requeue("jobs", [Requeue(d.id, d.receipt, delay_ms=3_600_000) for d in got[4:8]])
        e.put_queue(
            "jobs", QueueConfig(default_lease_ms=9000, max_deliveries=3, dead_letter_queue="dead")
        )
        e.pause("jobs")
        e.enqueue("doomed", [NewItem(b"x")])
        e.enqueue("purged", [NewItem(b"p %d" % i) for i in range(50)])
        assert e.purge("purged") == 50
        e.delete_queue("doomed")
        e.pause("before")
        e.resume("before")
        e.delete_item("jobs", ids[-1])
        wait_for(lambda: caught_up(leader))
        mine, theirs = contents(f.engine), contents(leader.engine)
        assert sorted(mine) == ["before", "dead", "jobs", "purged"]
        assert mine["jobs"]["paused"] and not mine["before"]["paused"]
        assert mine["jobs"]["config"].default_lease_ms == 9000
        assert mine["purged"]["items"] == [] and len(mine["jobs"]["items"]) == 25
        assert mine == theirs
    assert reopened(tmp_path / "f1") == contents(leader.engine)


@pytest.mark.parametrize("leader", [1], indirect=True)
def test_a_late_follower_resyncs_from_a_snapshot_while_writes_go_on(
    leader: Leader, tmp_path: Path
) -> None:
    writer = Writer(leader.engine).start()
    try:
        writer.wait_acked(300)
        with following(leader, tmp_path / "f1") as f:
            writer.wait_acked(len(writer.acked) + 300)
            wait_for(lambda: "f1" in leader.sync.members, what="f1 in the sync set")
            writer.wait_acked(len(writer.acked) + 300)
            writer.stop()
            wait_for(lambda: caught_up(leader), what="the follower's ack to reach the last lsn")
            assert f.follower.status().resyncs == 1 and f.reports == []
            assert f.follower.status().lsn == leader.rep.last_lsn
            assert contents(f.engine) == contents(leader.engine)
    finally:
        writer.stop()
    assert not writer.errors and writer.unknown == 0
    assert reopened(tmp_path / "f1") == contents(leader.engine)


def test_a_follower_left_behind_by_the_window_is_told_to_resync_and_does(tmp_path: Path) -> None:
    """A 409 resync_needed in the middle of a stream: a follower whose disk stalled while
    the leader's window overflowed is detached, and starts over from a new snapshot."""
    with (
        leading(tmp_path, min_insync=1, window_bytes=64 << 10) as leader,
        following(leader, tmp_path / "f1", slow=True) as f,
    ):
        leader.engine.enqueue("q", [NewItem(b"first")])
        wait_for(lambda: "f1" in leader.sync.members and caught_up(leader))
        f.disk.gate.clear()
        leader.engine.enqueue("q", [NewItem(b"stalls the follower")])
        assert f.disk.waiting.wait(10)
        # silent: out of the sync set, then the window outgrows its bytes and drops it
        for i in range(40):
            leader.engine.enqueue("q", [NewItem(b"%d" % i + b"x" * 4096)])
        wait_for(lambda: "f1" not in leader.rep.followers(), what="f1 to be detached")
        f.disk.gate.set()
        wait_for(lambda: f.follower.status().resyncs == 2, what="the second snapshot")
        wait_for(lambda: caught_up(leader), what="the follower to catch up")
        assert f.reports == []  # asked for by the leader: no trouble
        assert contents(f.engine) == contents(leader.engine)
        assert f.engine.stats("q").pending == 42


@pytest.mark.parametrize("leader", [1], indirect=True)
def test_a_follower_killed_mid_stream_resyncs_and_converges(leader: Leader, tmp_path: Path) -> None:
    data = tmp_path / "f1"
    proc = FollowerProcess(data, leader.url)
    writer = Writer(leader.engine).start()
    try:
        writer.wait_acked(200)
        proc.start()
        wait_for(lambda: leader.acked("f1") > 0, what="the first acknowledgement")
        writer.wait_acked(len(writer.acked) + 300)
        proc.kill()
        killed_at = leader.acked("f1")
        writer.wait_acked(len(writer.acked) + 300)  # the leader goes on without it
        assert leader.rep.last_lsn > killed_at
        proc.start()
        writer.wait_acked(len(writer.acked) + 300)
        writer.stop()
        wait_for(lambda: caught_up(leader), what="the restarted follower to catch up")
        assert proc.terminate() == 0
    finally:
        writer.stop()
        proc.kill()
    assert not writer.errors
    log = proc.log.read_text()
    assert log.count("FOLLOWING") == 2 and "TROUBLE" not in log, log
    assert reopened(data) == contents(leader.engine)
    assert not [n for n in os.listdir(data) if n.startswith(".replica-")]


@pytest.mark.parametrize("leader", [1], indirect=True)
def test_frames_failing_their_crc_are_refused_and_nothing_is_applied(
    leader: Leader, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Real frames of a real leader, served again with one byte damaged."""
    with httpx.Client(
        base_url=leader.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=20
    ) as c:
        r = c.post("/v1/replica/snapshot", json={"node": "tap", "epoch": EPOCH})
        assert r.status_code == 200
        leader.engine.enqueue("q", [NewItem(b"a"), NewItem(b"b")])  # commits alone
        r = c.post(
            "/v1/replica/pull", json={"node": "tap", "epoch": EPOCH, "after": 0, "wait_ms": 1000}
        )
        assert r.status_code == 200 and r.content
    frames = decode_frames(r.content)
    with FakeLeader(epoch=EPOCH) as fake:
        fake.add(*frames)
        fake.corrupt_next = True
        engine = Engine.open(tmp_path / "f", EngineConfig(fsync="always"))
        reports: list[tuple[str, str]] = []
        follower = Follower(
            engine,
            str(tmp_path / "f"),
            "f",
            report=lambda c, m: reports.append((c, m)),
            wait_ms=100,
            backoff_s=(0.3, 0.3),
        )
        try:
            follower.follow(fake.url, EPOCH)
            wait_for(lambda: bool(reports))
            assert reports[0][0] == "corruption"
            assert engine.list_queues() == []  # nothing of the damaged answer
            assert any(
                r.levelname == "ERROR" and "corruption" in r.getMessage() for r in caplog.records
            )
            wait_for(lambda: engine.list_queues() == ["q"] and engine.stats("q").pending == 2)
            assert [i.value for i in engine.browse("q", "all", None, 10, True).items] == [
                b"a",
                b"b",
            ]
        finally:
            follower.stop()
            engine.close()
