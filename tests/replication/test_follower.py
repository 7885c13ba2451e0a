"""The follower's loop against a scripted leader and a recording engine.

What is checked: the epoch is on disk before the leader hears from the follower; a
lower epoch is refused; every join installs a snapshot; frames the snapshot holds are
skipped; the acknowledgement (``after``) only moves once an apply is durable; a frame
failing its crc, or a gap in the lsns, applies nothing and is reported; 409s, 421s and
an unreachable leader are reported and retried; stop is prompt.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from dq.server.replication.follower import Follower, StaleEpoch
from dq.server.replication.leader_client import LeaderClient
from dq.server.replication.member import _Following
from dq.server.replication.routes import ClusterDoc
from dq.storage.replication import KIND_CONTROL, KIND_RECORD, Frame
from tests.replication.fake_leader import FakeLeader, Request
from tests.server.live import free_port

pytestmark = pytest.mark.integration  # a fake leader served over HTTP


class RecordingEngine:
    """Records what the follower asks of the engine; ``hold`` keeps applies pending."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.roles: list[tuple[bool, str | None]] = []
        self.applied: list[Frame] = []
        self.installed: list[dict[str, list[str]]] = []
        self.hold = False
        self.pending: list[Future[None]] = []
        self.fail_apply: Exception | None = None

    def set_role(self, writable: bool, leader: str | None) -> None:
        self.roles.append((writable, leader))

    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]:
        future: Future[None] = Future()
        if self.fail_apply is not None:
            future.set_exception(self.fail_apply)
            return future
        self.applied.extend(frames)
        if self.hold:
            self.pending.append(future)
        else:
            future.set_result(None)
        return future

    def replace_queues(self, src_dir: str) -> None:
        queues = os.path.join(src_dir, "queues")
        self.installed.append(
            {q: sorted(os.listdir(os.path.join(queues, q))) for q in os.listdir(queues)}
        )
        target = self.root / "queues"
        shutil.rmtree(target, ignore_errors=True)
        os.rename(queues, target)


def rec(lsn: int, queue: str = "a") -> Frame:
    return Frame(lsn, queue, KIND_RECORD, f"payload {lsn}".encode())


def wait(predicate: object, timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > give_up:
            raise AssertionError("timed out")
        time.sleep(0.01)


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    (d / "queues").mkdir(parents=True)
    return d


@pytest.fixture
def engine(data_dir: Path) -> RecordingEngine:
    return RecordingEngine(data_dir)


@pytest.fixture
def leader() -> Iterator[FakeLeader]:
    with FakeLeader(epoch=5) as fake:
        yield fake


@pytest.fixture
def reports() -> list[tuple[str, str]]:
    return []


@pytest.fixture
def follower(
    engine: RecordingEngine, data_dir: Path, reports: list[tuple[str, str]]
) -> Iterator[Follower]:
    f = Follower(
        engine,
        str(data_dir),
        "f1",
        token="s3cret",
        report=lambda code, message: reports.append((code, message)),
        wait_ms=200,
        timeout_s=2.0,
        backoff_s=(0.01, 0.05),
    )
    try:
        yield f
    finally:
        f.stop(timeout=10)


def test_follows_a_leader_from_its_snapshot(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, data_dir: Path
) -> None:
    leader.snapshot_lsn = 3
    leader.snapshot_queues = {
        "a": {"queue.json": b"{}", "00000001.log": b"a-log"},
        "b": {"queue.json": b"{}"},
    }
    leader.snapshot_lsns = {"a": 3, "b": 5}
    # 4 and 5 are frames of b its snapshot copy already holds; 4 of a is new
    leader.add(Frame(4, "b", KIND_RECORD, b"b4"), rec(5, "a"), Frame(6, "b", KIND_RECORD, b"b6"))
    seen_epochs: list[int] = []

    def look(request: Request) -> None:
        path = data_dir / "replica.json"
        seen_epochs.append(json.loads(path.read_text())["epoch"] if path.exists() else 0)

    leader.on_request = look
    follower.follow(leader.url, 5, leader_node="n1")
    assert engine.roles == [(False, leader.url)]  # client writes are refused from now on
    leader.wait_for(lambda: any(p.body["after"] == 6 for p in leader.pulls()))
    assert engine.installed == [{"a": ["00000001.log", "queue.json"], "b": ["queue.json"]}]
    assert (data_dir / "queues" / "a" / "00000001.log").read_bytes() == b"a-log"
    assert [(f.lsn, f.queue) for f in engine.applied] == [(5, "a"), (6, "b")]
    assert set(seen_epochs) == {5}  # on disk before the first request
    first = leader.snapshots()[0]
    assert first.body == {"node": "f1", "epoch": 5}
    assert first.authorization == "Bearer s3cret"
    afters = [p.body["after"] for p in leader.pulls()]
    assert afters[0] == 3 and afters == sorted(afters)
    assert all(p.body["node"] == "f1" and p.body["epoch"] == 5 for p in leader.pulls())
    status = follower.status().as_json()
    assert status["state"] == "streaming" and status["lsn"] == 6 and status["epoch"] == 5
    assert status["leader"] == {"node": "n1", "url": leader.url} and status["commit_lsn"] == 6
    assert status["last_error"] is None and status["resyncs"] == 1
    leader.add(Frame(7, "c", KIND_CONTROL, b'{"op":"put_queue","config":{}}'), rec(8, "c"))
    leader.wait_for(lambda: any(p.body["after"] == 8 for p in leader.pulls()))
    assert [f.lsn for f in engine.applied] == [5, 6, 7, 8]
    assert not [d for d in os.listdir(data_dir) if d.startswith(".replica-")]


def test_a_lower_epoch_is_refused_even_after_a_restart(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, data_dir: Path
) -> None:
    follower.follow(leader.url, 5)
    with pytest.raises(StaleEpoch):
        follower.follow("http://127.0.0.1:1", 4)
    assert follower.status().leader is not None and follower.status().leader.url == leader.url
    follower.stop(timeout=10)
    again = Follower(engine, str(data_dir), "f1")
    with pytest.raises(StaleEpoch):
        again.follow(leader.url, 4)
    assert again.status().state == "stopped"


def test_the_ack_waits_until_the_apply_is_durable(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine
) -> None:
    engine.hold = True
    leader.add(rec(1), rec(2))
    follower.follow(leader.url, 5)
    wait(lambda: len(engine.pending) == 1)
    time.sleep(0.3)
    assert [p.body["after"] for p in leader.pulls()] == [0]  # no pull while the fsync runs
    assert follower.status().lsn == 0
    engine.hold = False
    engine.pending[0].set_result(None)
    leader.wait_for(lambda: any(p.body["after"] == 2 for p in leader.pulls()))


def test_a_frame_failing_its_crc_applies_nothing_and_is_reported(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    leader.add(rec(1), rec(2), rec(3))
    leader.corrupt_next = True
    follower.follow(leader.url, 5)
    wait(lambda: len(leader.snapshots()) >= 2)  # refused, then a fresh start
    assert [code for code, _ in reports][:1] == ["corruption"]
    assert "checksum" in reports[0][1] and "nothing applied" in reports[0][1]
    leader.wait_for(lambda: any(p.body["after"] == 3 for p in leader.pulls()))
    assert engine.applied == [rec(1), rec(2), rec(3)]  # only the good copy, once
    assert follower.status().last_error is not None
    assert follower.status().last_error["code"] == "corruption"


def test_a_gap_in_the_lsns_applies_nothing(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    leader.add(rec(1), rec(3))
    follower.follow(leader.url, 5)
    wait(lambda: len(reports) >= 2)
    assert {code for code, _ in reports} == {"protocol"}
    assert engine.applied == []
    assert all(p.body["after"] == 0 for p in leader.pulls())


def test_resync_needed_installs_a_fresh_snapshot(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    with leader.cond:
        leader.snapshot_lsn = 10
        leader.snapshot_queues = {"a": {"queue.json": b"{}"}}
        leader.frames = [rec(n) for n in range(1, 12)]
        leader.refusals.append((409, "resync_needed"))
    leader.wait_for(lambda: any(p.body["after"] == 11 for p in leader.pulls()))
    assert len(leader.snapshots()) == 2 and len(engine.installed) == 2
    assert [f.lsn for f in engine.applied] == [1, 11]
    assert reports == []  # asked for by the leader: not trouble
    assert follower.status().resyncs == 2


@pytest.mark.parametrize(
    ("status", "code"), [(409, "stale_leader"), (421, "not_leader"), (500, "internal")]
)
def test_refusals_are_reported_and_retried(
    follower: Follower, leader: FakeLeader, reports: list[tuple[str, str]], status: int, code: str
) -> None:
    leader.refusals = [(status, code), (status, code)]
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    expected = code if code in ("stale_leader", "not_leader") else "refused"
    assert [c for c, _ in reports] == [expected, expected]
    assert len(leader.snapshots()) == 1  # the stream goes on where it was
    assert follower.status().last_error is not None


def test_an_unreachable_leader_is_reported_and_retried(
    follower: Follower, reports: list[tuple[str, str]]
) -> None:
    follower.follow(f"http://127.0.0.1:{free_port()}", 5)
    wait(lambda: len(reports) >= 3)
    assert {c for c, _ in reports} == {"unreachable"}
    assert follower.status().state == "resyncing"


def test_a_snapshot_of_another_epoch_is_not_installed(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    leader.snapshot_epoch = 4
    follower.follow(leader.url, 5)
    wait(lambda: len(reports) >= 2)
    assert {c for c, _ in reports} == {"stale_leader"}
    assert engine.installed == [] and leader.pulls() == []


def test_a_failed_apply_resyncs(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    engine.fail_apply = OSError("disk gone")
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    wait(lambda: len(leader.snapshots()) >= 2)
    assert reports[0][0] == "apply_failed" and "disk gone" in reports[0][1]
    assert all(p.body["after"] == 0 for p in leader.pulls())


def test_stop_is_prompt_while_a_pull_is_held(
    follower: Follower, leader: FakeLeader, reports: list[tuple[str, str]]
) -> None:
    leader.hold_s = 30.0
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: len(leader.pulls()) == 1)
    started = time.monotonic()
    follower.stop(timeout=10)
    assert time.monotonic() - started < 2.0
    assert follower.status().state == "stopped" and reports == []
    assert not [t for t in threading.enumerate() if t.name == "dq-replica-follower"]


def test_a_new_leader_replaces_the_old_one(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine
) -> None:
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    with FakeLeader(epoch=6) as successor:
        successor.snapshot_lsn = 0
        successor.add(rec(1, "z"))
        follower.follow(successor.url, 6, leader_node="n2")
        successor.wait_for(lambda: any(p.body["after"] == 1 for p in successor.pulls()))
        count = len(leader.requests)
        time.sleep(0.3)
        assert len(leader.requests) == count  # the old leader hears nothing more
        assert engine.roles[-1] == (False, successor.url)
        assert follower.status().epoch == 6 and len(engine.installed) == 2
        follower.stop(timeout=10)


def test_following_again_after_stop(follower: Follower, leader: FakeLeader) -> None:
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    follower.stop(timeout=10)
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: len(leader.snapshots()) == 2)
    leader.wait_for(lambda: sum(p.body["after"] == 1 for p in leader.pulls()) >= 2)


def test_the_cluster_document_shows_the_pull_loop(
    follower: Follower, leader: FakeLeader, reports: list[tuple[str, str]]
) -> None:
    """What a follower adds to GET /v1/cluster, checked against the route's own schema."""
    leader.refusals = [(500, "internal")]
    leader.add(rec(1))
    follower.follow(leader.url, 5, leader_node="n1")
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    figures = _Following(follower, node=None).describe()  # type: ignore[arg-type]
    doc = ClusterDoc.model_validate(
        {
            "node": "f1",
            "role": "follower",
            "epoch": 5,
            "leader": {"node": "n1", "url": leader.url},
            "sync": [],
            "followers": {},
            **figures,
        }
    )
    assert doc.lsn == 1 and doc.commit_lsn == 1
    assert doc.replica is not None and doc.replica.state == "streaming"
    assert doc.replica.resyncs == 1
    assert doc.replica.last_error is not None and doc.replica.last_error.code == "refused"


def test_stop_during_a_snapshot_leaves_nothing_and_reports_nothing(
    follower: Follower,
    leader: FakeLeader,
    engine: RecordingEngine,
    data_dir: Path,
    reports: list[tuple[str, str]],
) -> None:
    leader.snapshot_queues = {"a": {"queue.json": b"{}", "00000001.log": b"x" * 200_000}}
    leader.snapshot_stall_s = 30.0
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: len(leader.snapshots()) == 1)
    wait(lambda: any(n.startswith(".replica-") for n in os.listdir(data_dir)))
    started = time.monotonic()
    follower.stop(timeout=10)
    assert time.monotonic() - started < 2.0
    assert reports == [] and engine.installed == []
    assert follower.status().state == "stopped"
    assert not [n for n in os.listdir(data_dir) if n.startswith(".replica-")]


def test_pulls_reuse_one_connection(follower: Follower, leader: FakeLeader) -> None:
    """A pull per round trip: opening a connection for each would add its handshake to
    every commit the leader waits for."""
    follower.follow(leader.url, 5)
    for lsn in range(1, 6):
        leader.add(rec(lsn))
        leader.wait_for(lambda lsn=lsn: any(p.body["after"] == lsn for p in leader.pulls()))
    assert len({p.peer for p in leader.pulls()}) == 1
    assert leader.snapshots()[0].peer not in {p.peer for p in leader.pulls()}


def test_an_aborted_client_sends_nothing_more(leader: FakeLeader) -> None:
    """What fences a replaced leader on this side: once ``follow`` has aborted the old
    leader's client (before the newer epoch is written), not one more request, so not
    one more acknowledgement, reaches it, on a kept-alive connection or a new one."""
    client = LeaderClient(leader.url, timeout_s=2.0)
    client.pull("f1", 5, 0, 0)
    client.abort()
    with pytest.raises(OSError):
        client.pull("f1", 5, 0, 0)
    with pytest.raises(OSError), client.snapshot("f1", 5):
        pass
    client.close()
    assert len(leader.requests) == 1


def test_an_apply_that_stalls_is_logged_with_where_it_waits(
    engine: RecordingEngine, data_dir: Path, leader: FakeLeader, caplog: pytest.LogCaptureFixture
) -> None:
    """A follower blocked in its engine acknowledges nothing and the leader's writes wait:
    that must show in the log (with the stack) and in the status, not pass in silence."""
    engine.hold = True
    follower = Follower(engine, str(data_dir), "f1", wait_ms=100, stall_warn_s=0.3)
    try:
        leader.add(rec(1), rec(2, "b"))
        follower.follow(leader.url, 5)
        wait(lambda: any("replication stalled" in r.getMessage() for r in caplog.records))
        (first, *_) = [r.getMessage() for r in caplog.records if "stalled" in r.getMessage()]
        assert "applying lsn 1..2 to a, b: waiting for" in first
        assert "in _apply" in first  # the loop's stack, where it waits
        error = follower.status().last_error
        assert error is not None and error["code"] == "stalled"
        engine.hold = False
        engine.pending[0].set_result(None)
        leader.wait_for(lambda: any(p.body["after"] == 2 for p in leader.pulls()))
    finally:
        follower.stop(timeout=10)


def test_a_loop_that_dies_says_so_and_the_node_sees_it(
    follower: Follower, leader: FakeLeader, caplog: pytest.LogCaptureFixture
) -> None:
    """Never expected; but a member whose loop ended would acknowledge nothing in silence."""
    follower.follow(leader.url, 5)
    role = _Following(follower, node=None)  # type: ignore[arg-type]
    leader.wait_for(lambda: len(leader.pulls()) >= 1)
    assert follower.following and not role.done

    def broken(target: object, seconds: float) -> None:
        raise SystemError("a bug in the loop")

    follower._pause = broken  # type: ignore[method-assign]
    leader.refusals.append((500, "internal"))  # a trouble: the loop pauses next
    wait(lambda: not follower.following)
    assert role.done
    assert any("ended unexpectedly" in r.getMessage() for r in caplog.records)
    status = follower.status()
    assert status.state == "stopped" and status.last_error is not None
    follower.stop()
    follower.follow(leader.url, 5)  # the node starts it again
    assert follower.following


def test_a_failed_install_is_a_failed_resync_and_is_retried(
    follower: Follower, leader: FakeLeader, engine: RecordingEngine, reports: list[tuple[str, str]]
) -> None:
    calls: list[str] = []
    install = engine.replace_queues

    def failing_once(src_dir: str) -> None:
        calls.append(src_dir)
        if len(calls) == 1:
            raise OSError(28, "No space left on device", src_dir)
        install(src_dir)

    engine.replace_queues = failing_once  # type: ignore[method-assign]
    leader.add(rec(1))
    follower.follow(leader.url, 5)
    leader.wait_for(lambda: any(p.body["after"] == 1 for p in leader.pulls()))
    assert [code for code, _ in reports] == ["resync_failed"]
    assert "No space left" in reports[0][1] and len(leader.snapshots()) == 2
