"""The replication routes over HTTP, on a real server (uvicorn with dq's protocol, in a
thread of the test process) whose engine leads through a Replicator: the tokens, the wire
of pull (frames, headers, long-poll, the refusals and their codes), the snapshot tar (its
content, its directory removed after streaming, a follower that drops it mid-way), an
enqueue over HTTP answered only after a pull acknowledged it, and GET /v1/cluster."""

from __future__ import annotations

import asyncio
import io
import json
import os
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from dq.server.replication.leader import Replicator
from dq.server.replication.snapshot_stream import snapshot_dirs
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig
from dq.storage.replication import decode_frames
from dq.storage.types import NewItem
from tests.replication.inproc import InProcessServer, in_process_server
from tests.replication.members import Members

pytestmark = pytest.mark.integration  # an in-process leader served over HTTP

TOKEN = "s3cret"
READER = "r3ader"
EPOCH = 7


class Node:
    """What the routes read of the node's role machine."""

    def __init__(self, url: str) -> None:
        self.role = "leader"
        self.leader: dict[str, str] | None = {"node": "n1", "url": url}

    def describe(self) -> dict[str, Any]:
        return {"node": "n1", "role": self.role, "epoch": EPOCH, "leader": self.leader}


@dataclass
class Leader:
    server: InProcessServer
    engine: Engine
    rep: Replicator
    node: Node
    data: Path
    steps: list[str] = field(default_factory=list)

    def client(self, token: str = TOKEN) -> httpx.Client:
        return httpx.Client(
            base_url=self.server.url, headers={"Authorization": f"Bearer {token}"}, timeout=20
        )

    def wait(self, check: Callable[[], bool], timeout: float = 10.0) -> None:
        give_up = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < give_up, "condition not reached in time"
            time.sleep(0.02)


@pytest.fixture
def leader(tmp_path: Path) -> Iterator[Leader]:
    data = tmp_path / "data"
    engine = Engine.open(data, EngineConfig(fsync="always"))
    engine.enqueue("q", [NewItem(b"before-%d" % i) for i in range(3)])
    settings = Settings(
        data_dir=str(data), fsync="always", tokens=(TOKEN,), read_tokens=(READER,), shm=False
    )
    try:
        with in_process_server(settings, engine) as server:
            node = Node(server.url)
            steps: list[str] = []
            rep = Replicator(
                engine,
                node="n1",
                epoch=EPOCH,
                coordinator=Members(),
                step_down=steps.append,
                min_insync=2,
                commit_timeout_s=10.0,
            )
            server.call(rep.start)
            engine.set_replication(rep)
            server.app.state.node = node
            server.app.state.replicator = rep
            try:
                yield Leader(server, engine, rep, node, data, steps)
            finally:
                server.app.state.replicator = None
                engine.set_replication(None)
                server.call(rep.stop)
    finally:
        engine.close()


def snapshot(c: httpx.Client, node: str = "f1") -> tuple[dict[str, Any], list[str], bytes]:
    r = c.post("/v1/replica/snapshot", json={"node": node, "epoch": EPOCH})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/x-tar"
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r|") as tar:
        names: list[str] = []
        doc: dict[str, Any] = {}
        for member in tar:
            names.append(member.name)
            if member.name == "snapshot.json":
                f = tar.extractfile(member)
                assert f is not None
                doc = json.loads(f.read())
    return doc, names, r.content


def pull(c: httpx.Client, after: int, wait_ms: int = 0, **over: Any) -> httpx.Response:
    body = {"node": "f1", "epoch": EPOCH, "after": after, "wait_ms": wait_ms, **over}
    return c.post("/v1/replica/pull", json=body)


def test_the_replica_routes_need_a_token_that_may_write(leader: Leader) -> None:
    with httpx.Client(base_url=leader.server.url, timeout=10) as anon:
        assert anon.post("/v1/replica/pull", json={}).status_code == 401
        assert anon.post("/v1/replica/snapshot", json={}).status_code == 401
        assert anon.get("/v1/cluster").status_code == 401
    with leader.client(READER) as reader:
        r = reader.post("/v1/replica/pull", json={"node": "f1", "epoch": EPOCH, "after": 0})
        assert r.status_code == 403
        assert reader.get("/v1/cluster").status_code == 200


def test_snapshot_then_pulls_carry_the_frames_and_acknowledge_them(leader: Leader) -> None:
    with leader.client() as c:
        doc, names, _ = snapshot(c)
        assert names[0] == "snapshot.json"
        assert doc == {"epoch": EPOCH, "lsn": 0, "queues": {"q": 0}}
        assert any(n.startswith("queues/q/") for n in names)
        assert "queues/q/queue.json" in names
        leader.wait(lambda: snapshot_dirs(str(leader.data)) == [])

        r = pull(c, 0)
        assert r.status_code == 200
        assert r.content == b""
        assert r.headers["x-dq-epoch"] == str(EPOCH)
        assert r.headers["x-dq-commit"] == "0"
        leader.wait(lambda: leader.rep.followers()["f1"].in_sync)

        answered: list[httpx.Response] = []
        writer = threading.Thread(
            target=lambda: answered.append(
                c.post("/v1/queues/q/items", json={"items": [{"value": "after"}]})
            )
        )
        writer.start()
        try:
            r = pull(c, 0, wait_ms=1000)
            frames = decode_frames(r.content)
            assert [f.queue for f in frames] == ["q"]
            assert b"after" in frames[0].payload
            time.sleep(0.2)
            assert answered == []  # not acknowledged yet
            assert r.headers["x-dq-commit"] == "0"
            r = pull(c, frames[-1].lsn)
            assert r.headers["x-dq-commit"] == str(frames[-1].lsn)
        finally:
            writer.join(10)
        assert [a.status_code for a in answered] == [200]
        scrape = c.get("/metrics").text
        last = frames[-1].lsn
        for line in (
            f"dq_replication_epoch {float(EPOCH)}",
            f"dq_replication_lsn {float(last)}",
            f"dq_replication_commit_lsn {float(last)}",
            'dq_replication_follower_lag{node="f1"} 0.0',
            'dq_replication_follower_in_sync{node="f1"} 1.0',
        ):
            assert line in scrape.splitlines(), line
        status = c.get("/v1/cluster").json()
        assert status == {
            "node": "n1",
            "role": "leader",
            "epoch": EPOCH,
            "leader": {"node": "n1", "url": leader.server.url},
            "lsn": last,
            "commit_lsn": last,
            "sync": ["n1", "f1"],
            "followers": {"f1": {"acked": last, "in_sync": True}},
        }


def test_a_pull_waits_for_frames_up_to_its_wait(leader: Leader) -> None:
    with leader.client() as c:
        snapshot(c)
        t0 = time.monotonic()
        r = pull(c, 0, wait_ms=300)
        assert r.status_code == 200 and r.content == b""
        assert 0.25 < time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        r = pull(c, 0, wait_ms=60_000)  # capped at one second
        assert r.status_code == 200 and r.content == b""
        assert time.monotonic() - t0 < 3.0


def test_refusals_answer_the_wire_codes(leader: Leader) -> None:
    with leader.client() as c:
        r = pull(c, 0)
        assert r.status_code == 409
        assert r.json()["error"] == "resync_needed"
        assert r.json()["message"]
        snapshot(c)
        assert pull(c, 99).json()["error"] == "resync_needed"
        assert pull(c, 0, epoch=EPOCH - 1).json()["error"] == "resync_needed"
        assert pull(c, 0, node="bad/name").status_code == 422
        assert pull(c, -1).status_code == 422
        assert leader.steps == []
        r = pull(c, 0, epoch=EPOCH + 1)
        assert (r.status_code, r.json()["error"]) == (409, "stale_leader")
        leader.wait(lambda: len(leader.steps) == 1)
        r = c.post("/v1/replica/snapshot", json={"node": "f2", "epoch": EPOCH + 2})
        assert (r.status_code, r.json()["error"]) == (409, "stale_leader")


def test_a_node_that_does_not_lead_answers_not_leader(leader: Leader) -> None:
    leader.server.app.state.replicator = None
    leader.node.role = "follower"
    leader.node.leader = {"node": "n2", "url": "http://127.0.0.1:1"}
    with leader.client() as c:
        r = pull(c, 0)
        assert r.status_code == 421
        assert r.json()["error"] == "not_leader"
        assert "does not lead" in r.json()["message"]
        r = c.post("/v1/replica/snapshot", json={"node": "f1", "epoch": EPOCH})
        assert r.status_code == 421
        status = c.get("/v1/cluster").json()
        assert (status["role"], status["leader"]["node"], status["sync"]) == ("follower", "n2", [])


def test_a_single_node_has_no_replica_routes(leader: Leader) -> None:
    leader.server.app.state.replicator = None
    leader.server.app.state.node = None
    with leader.client() as c:
        assert pull(c, 0).status_code == 404
        assert "dq_replication" not in c.get("/metrics").text
        status = c.get("/v1/cluster").json()
        assert status["role"] == "single"
        assert status["leader"] is None


def test_a_snapshot_dropped_midway_is_cleaned_up_and_releases_its_follower(
    leader: Leader,
) -> None:
    # about 12 MiB of queue files: more than the stream holds in memory, so the
    # producer is still writing when the follower goes away
    values = [NewItem(os.urandom(60_000)) for _ in range(200)]
    leader.rep.min_insync = 1  # these writes need no follower
    leader.engine.enqueue("q", values)
    with leader.client() as c:
        with c.stream("POST", "/v1/replica/snapshot", json={"node": "f9", "epoch": EPOCH}) as r:
            assert r.status_code == 200
            got = next(r.iter_raw(64 * 1024))
            assert got
            assert "f9" in leader.rep.followers()
        leader.wait(lambda: snapshot_dirs(str(leader.data)) == [])
        leader.wait(lambda: "f9" not in leader.rep.followers())
        doc, _, content = snapshot(c, "f8")
        assert len(content) > 12_000_000
        assert doc["queues"]["q"] >= 1


def test_a_snapshot_is_served_while_the_default_executor_is_full(leader: Leader) -> None:
    """Admin calls waiting for a commit can fill the loop's default executor; the
    snapshot of the follower that commit needs must not queue behind them."""
    release = threading.Event()

    async def fill() -> list[asyncio.Future[bool]]:
        loop = asyncio.get_running_loop()
        return [loop.run_in_executor(None, release.wait, 60) for _ in range(64)]

    leader.server.call(fill)
    try:
        with leader.client() as c:
            doc, names, _ = snapshot(c)
            assert doc["epoch"] == EPOCH and "queues/q/queue.json" in names
            assert pull(c, doc["lsn"]).status_code == 200
    finally:
        release.set()


def _raw_post(url: str, path: str, body: bytes, chunked: bool) -> bytes:
    """One POST over a fresh socket, ``Connection: close``; the whole answer."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nConnection: close\r\n"
    ).encode()
    if chunked:
        data = head + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    else:
        data = head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    with socket.create_connection((parts.hostname, parts.port), timeout=20) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    return out


def _without_date(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"date:")]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def test_a_pull_answers_the_same_bytes_on_the_fast_path_and_through_the_route(
    leader: Leader, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The protocol serves a follower's pull itself (it is on every replicated write's
    path); its answer is the FastAPI route's, byte for byte, refusals included (those
    it hands to the route)."""
    import dq.server.replication.hot_pull as hot_pull

    served: list[int] = []
    real = hot_pull.answer_pull

    async def counting(*args: Any) -> None:
        served.append(1)
        await real(*args)

    monkeypatch.setattr(hot_pull, "answer_pull", counting)
    with leader.client() as c:
        doc, _names, _tar = snapshot(c)
    start = doc["lsn"]
    leader.engine.enqueue_nowait("q", [NewItem(b"shipped")])
    leader.wait(lambda: leader.rep.last_lsn > start)
    body = json.dumps({"node": "f1", "epoch": EPOCH, "after": start}).encode()
    fast = _raw_post(leader.server.url, "/v1/replica/pull", body, chunked=False)
    route = _raw_post(leader.server.url, "/v1/replica/pull", body, chunked=True)
    assert served == [1]  # the first was the fast path's, the chunked one the route's
    assert fast.startswith(b"HTTP/1.1 200 ")
    assert b"content-type: application/octet-stream" in fast
    frames = decode_frames(fast.partition(b"\r\n\r\n")[2])
    assert frames[0].payload.endswith(b"shipped")
    assert _without_date(fast) == _without_date(route)
    # a refusal (an unknown follower) is the route's on both paths
    served.clear()
    stranger = json.dumps({"node": "f9", "epoch": EPOCH, "after": 0}).encode()
    fast = _raw_post(leader.server.url, "/v1/replica/pull", stranger, chunked=False)
    route = _raw_post(leader.server.url, "/v1/replica/pull", stranger, chunked=True)
    assert fast.startswith(b"HTTP/1.1 409 ") and b"resync_needed" in fast
    assert _without_date(fast) == _without_date(route)
    assert served == [1]
