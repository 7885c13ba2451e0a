"""The leader's routes and the follower's loop (``server/replication/follower.py``)
against each other over real HTTP: a follower joins by snapshot, is counted, every write
on the leader is answered only once the follower has it, queue changes follow, and a
follower that rejoins resyncs in full and catches up. Two engines (fsync=always), one
leading on a real server in the test process, one following it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from dq.server.replication.follower import Follower
from dq.server.replication.leader import Replicator
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig
from dq.storage.types import NewItem
from tests.replication.inproc import InProcessServer, in_process_server
from tests.replication.members import Members

pytestmark = pytest.mark.integration  # an in-process leader served over HTTP

TOKEN = "tok"
EPOCH = 11


class Node:
    def __init__(self, url: str) -> None:
        self.url = url

    def describe(self) -> dict[str, object]:
        return {"node": "n1", "role": "leader", "epoch": EPOCH, "leader": None}


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[InProcessServer, Replicator, Engine, Follower]]:
    leader_engine = Engine.open(tmp_path / "leader", EngineConfig(fsync="always"))
    follower_dir = tmp_path / "follower"
    follower_engine = Engine.open(follower_dir, EngineConfig(fsync="always"))
    settings = Settings(data_dir=str(tmp_path / "leader"), tokens=(TOKEN,), shm=False)
    try:
        leader_engine.enqueue("early", [NewItem(b"e%d" % i) for i in range(5)])
        with in_process_server(settings, leader_engine) as server:
            rep = Replicator(
                leader_engine,
                node="n1",
                epoch=EPOCH,
                coordinator=Members(),
                step_down=lambda reason: None,
                min_insync=2,
                commit_timeout_s=20.0,
            )
            server.call(rep.start)
            leader_engine.set_replication(rep)
            server.app.state.node = Node(server.url)
            server.app.state.replicator = rep
            follower = Follower(follower_engine, str(follower_dir), "f1", token=TOKEN, wait_ms=200)
            try:
                yield server, rep, follower_engine, follower
            finally:
                follower.stop(20)
                server.app.state.replicator = None
                leader_engine.set_replication(None)
                server.call(rep.stop)
    finally:
        follower_engine.close()
        leader_engine.close()


def pending(engine: Engine, queue: str) -> int:
    return engine.stats(queue).pending if engine.has_queue(queue) else -1


def test_a_follower_joins_is_counted_and_holds_every_acknowledged_write(
    pair: tuple[InProcessServer, Replicator, Engine, Follower],
) -> None:
    server, rep, follower_engine, follower = pair
    follower.follow(server.url, EPOCH, leader_node="n1")
    wait_until(lambda: "f1" in rep.followers() and rep.followers()["f1"].in_sync)
    assert pending(follower_engine, "early") == 5  # from the snapshot
    with httpx.Client(
        base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    ) as c:
        for i in range(20):
            r = c.post("/v1/queues/jobs/items", json={"items": [{"value": f"v{i}"}]})
            assert r.status_code == 200, r.text
            # answered only once the follower acknowledged it: it is there already
            assert pending(follower_engine, "jobs") == i + 1
        r = c.post("/v1/queues/jobs/items", json={"items": [{"value": "b"}] * 50})
        assert r.status_code == 200
        assert pending(follower_engine, "jobs") == 70
        got = c.post("/v1/queues/jobs/dequeue", json={"count": 10})
        assert got.status_code == 200, got.text
        items = got.json()["items"]
        assert len(items) == 10
        r = c.post(
            "/v1/queues/jobs/release",
            json={"items": [{"id": d["id"], "receipt": d["receipt"]} for d in items]},
        )
        assert r.status_code == 200
        wait_until(lambda: pending(follower_engine, "jobs") == 60)
        assert c.delete("/v1/queues/early").status_code in (200, 204)
        wait_until(lambda: not follower_engine.has_queue("early"))
        status = c.get("/v1/cluster").json()
        assert status["sync"] == ["n1", "f1"]
        assert status["followers"]["f1"]["acked"] == status["lsn"]


def test_a_follower_that_rejoins_resyncs_and_catches_up(
    pair: tuple[InProcessServer, Replicator, Engine, Follower],
) -> None:
    server, rep, follower_engine, follower = pair
    follower.follow(server.url, EPOCH, leader_node="n1")
    wait_until(lambda: "f1" in rep.followers() and rep.followers()["f1"].in_sync)
    follower.stop(20)
    # written while the (still counted) follower is away: not answered yet
    done = server.engine.enqueue_nowait("early", [NewItem(b"x%d" % i) for i in range(30)])
    time.sleep(0.3)
    assert not done.done()
    assert pending(follower_engine, "early") == 5
    follower.follow(server.url, EPOCH, leader_node="n1")
    assert len(done.result(30)) == 30
    wait_until(lambda: pending(follower_engine, "early") == 35)
    wait_until(lambda: follower.status().lsn == rep.last_lsn)
    assert follower.status().resyncs >= 2
