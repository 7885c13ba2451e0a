"""The replica routes of a real ``dq serve`` leading a group in a real etcd, with the
test playing a follower over HTTP: the tokens, a snapshot (its directory removed after),
pulls that carry each write and hold its answer until acknowledged, the follower added
to and, once silent, removed from the sync set in etcd, and a pull from a newer epoch
making the leader step down (it leads again under a new epoch, and the old epoch's
follower is told to resync)."""

from __future__ import annotations

import io
import json
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from dq.server.replication.snapshot_stream import snapshot_dirs
from dq.storage.replication import decode_frames
from tests.replication.cluster import eventually
from tests.replication.etcd_server import EtcdServer
from tests.server.live import LiveServer, free_port, live_server

pytestmark = pytest.mark.timeout(180)

TOKEN = "tok-live"
READER = "rd-live"


@pytest.fixture
def leader(tmp_path: Path, etcd: EtcdServer, cluster: str) -> Iterator[LiveServer]:
    port = free_port()
    env = {
        "DQ_ETCD": etcd.url,
        "DQ_NODE": "n1",
        "DQ_CLUSTER": cluster,
        "DQ_ADVERTISE_URL": f"http://127.0.0.1:{port}",
        "DQ_LEADER_TTL_S": "1",
        "DQ_MIN_INSYNC": "1",
        "DQ_REPLICA_TIMEOUT_MS": "1000",
        "DQ_COMMIT_TIMEOUT_MS": "20000",
        "DQ_TOKENS": TOKEN,
        "DQ_READ_TOKENS": READER,
        "DQ_SHM": "0",
    }
    with live_server(tmp_path / "data", fsync="always", env=env, port=port) as server:
        yield server


def status(c: httpx.Client) -> dict[str, Any]:
    r = c.get("/v1/cluster")
    r.raise_for_status()
    doc: dict[str, Any] = r.json()
    return doc


def leading(c: httpx.Client, above: int = 0) -> dict[str, Any] | None:
    doc = status(c)
    return doc if doc["role"] == "leader" and doc["epoch"] > above else None


def test_a_follower_over_http_against_a_live_leader(leader: LiveServer) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with (
        httpx.Client(base_url=leader.url, headers=auth, timeout=30) as c,
        httpx.Client(base_url=leader.url, timeout=10) as anon,
    ):
        epoch = eventually("the server leads", lambda: leading(c))["epoch"]
        assert anon.post("/v1/replica/pull", json={}).status_code == 401
        read = {"Authorization": f"Bearer {READER}"}
        assert anon.post("/v1/replica/snapshot", json={}, headers=read).status_code == 403
        assert anon.get("/v1/cluster", headers=read).json()["role"] == "leader"

        r = c.post("/v1/queues/jobs/items", json={"items": [{"value": f"a{i}"} for i in range(3)]})
        assert r.status_code == 200, r.text

        snap = c.post("/v1/replica/snapshot", json={"node": "fx", "epoch": epoch})
        assert snap.status_code == 200, snap.text
        with tarfile.open(fileobj=io.BytesIO(snap.content), mode="r|") as tar:
            names = []
            doc: dict[str, Any] = {}
            for member in tar:
                names.append(member.name)
                if member.name == "snapshot.json":
                    f = tar.extractfile(member)
                    assert f is not None
                    doc = json.loads(f.read())
        assert names[0] == "snapshot.json" and "queues/jobs/queue.json" in names
        assert doc["epoch"] == epoch and doc["queues"]["jobs"] >= 1
        start = doc["lsn"]
        eventually(
            "the snapshot copy removed", lambda: snapshot_dirs(str(leader.data_dir)) == [] or None
        )

        def pull(after: int, wait_ms: int = 0, e: int = epoch) -> httpx.Response:
            return c.post(
                "/v1/replica/pull",
                json={"node": "fx", "epoch": e, "after": after, "wait_ms": wait_ms},
            )

        def joined() -> bool | None:
            # fx pulls as it waits, as a follower does: one silent for the replica
            # timeout (1 s, a slow join on a busy machine) would leave the sync set again
            assert pull(start).content == b""
            return status(c)["sync"] == ["n1", "fx"] or None

        eventually("fx in the sync set", joined)

        answered: list[int] = []
        writer = threading.Thread(
            target=lambda: answered.append(
                c.post("/v1/queues/jobs/items", json={"items": [{"value": "held"}]}).status_code
            )
        )
        writer.start()
        try:
            r = pull(start, 2000)
            frames = decode_frames(r.content)
            assert frames and b"held" in frames[-1].payload
            assert int(r.headers["x-dq-epoch"]) == epoch
            time.sleep(0.3)
            assert answered == []  # fx, a sync member, has not acknowledged it
            r = pull(frames[-1].lsn)
            assert int(r.headers["x-dq-commit"]) >= frames[-1].lsn
        finally:
            writer.join(20)
        assert answered == [200]

        # fx goes silent: it leaves the sync set and writes go on without it
        eventually("fx removed from the sync set", lambda: status(c)["sync"] == ["n1"] or None)
        r = c.post("/v1/queues/jobs/items", json={"items": [{"value": "alone"}]})
        assert r.status_code == 200

        # a pull from a newer epoch fences this leader: it steps down and leads again later
        r = pull(frames[-1].lsn, e=epoch + 1000)
        assert (r.status_code, r.json()["error"]) == (409, "stale_leader")
        again = eventually("leading a new epoch", lambda: leading(c, above=epoch))
        assert again["epoch"] > epoch
        r = pull(frames[-1].lsn)  # the old epoch's follower starts over
        assert (r.status_code, r.json()["error"]) == (409, "resync_needed")
        r = c.post("/v1/queues/jobs/dequeue", json={"count": 10})
        assert sorted(i["value"] for i in r.json()["items"]) == [
            "a0",
            "a1",
            "a2",
            "alone",
            "held",
        ]
