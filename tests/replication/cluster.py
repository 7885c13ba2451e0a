"""The replica group the end-to-end replication tests start: three ``dq serve`` members on
127.0.0.1 with 1 s leases, two in the sync set, and one etcd (``tests/replication/conftest.py``
gives it to a test as the fixture ``group``), with the waits its tests poll with."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx

from dq.client.errors import ClientError
from dq.server.replication.coordinator import ClusterView, Coordinator, LeaderInfo
from dq.server.replication.etcd import EtcdClient, EtcdError
from tests.replication.etcd_server import EtcdServer
from tests.server.live import LiveServer, free_port

__all__ = ["QUEUE", "Cluster", "eventually", "leader_other_than", "started_cluster"]

T = TypeVar("T")
QUEUE = "jobs"


def eventually(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """``probe()``'s first result that is not None (exceptions count as None)."""
    give_up = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < give_up:
        try:
            found = probe()
        except (ClientError, EtcdError, httpx.HTTPError) as exc:
            found, last = None, exc
        if found is not None:
            return found
        time.sleep(0.1)
    raise AssertionError(f"{what}: not within {timeout} s (last error: {last!r})")


class Cluster:
    def __init__(self, tmp: Path, etcd: EtcdServer, cluster: str) -> None:
        self.observer = Coordinator(EtcdClient(etcd.url), node="observer", url="-", cluster=cluster)
        self.servers: dict[str, LiveServer] = {}
        for name in ("n1", "n2", "n3"):
            port = free_port()
            env = {
                "DQ_ETCD": etcd.url,
                "DQ_NODE": name,
                "DQ_CLUSTER": cluster,
                "DQ_ADVERTISE_URL": f"http://127.0.0.1:{port}",
                "DQ_LEADER_TTL_S": "1",
                "DQ_MIN_INSYNC": "2",
                "DQ_REPLICA_TIMEOUT_MS": "1500",
                "DQ_COMMIT_TIMEOUT_MS": "5000",
                "DQ_SHM": "0",
            }
            (tmp / name).mkdir()
            self.servers[name] = LiveServer(tmp / name / "data", fsync="always", env=env, port=port)

    def view(self) -> ClusterView:
        return self.observer.read()

    def in_sync(self, count: int) -> ClusterView | None:
        view = self.view()
        if view.leader is None or view.sync is None or view.sync.leader != view.leader.node:
            return None
        return view if len(view.sync.members) >= count else None

    def describe(self, name: str) -> dict[str, Any]:
        answer = httpx.get(self.servers[name].url + "/v1/cluster", timeout=2)
        answer.raise_for_status()
        doc: dict[str, Any] = answer.json()
        return doc

    def close(self) -> None:
        for server in self.servers.values():
            server.kill()
        self.observer.client.close()


@contextlib.contextmanager
def started_cluster(
    tmp: Path, etcd: EtcdServer, cluster: str, env: Mapping[str, str] | None = None
) -> Iterator[Cluster]:
    """The three members, with ``env`` added to each one's environment, started in
    parallel (each start waits for /healthz); all killed after."""
    made = Cluster(tmp, etcd, cluster)
    try:
        for server in made.servers.values():
            server.env.update(env or {})
        with ThreadPoolExecutor(3) as pool:
            for started in [pool.submit(s.start, 90) for s in made.servers.values()]:
                started.result(timeout=120)
        yield made
    finally:
        made.close()


def leader_other_than(group: Cluster, node: str) -> Callable[[], LeaderInfo | None]:
    def probe() -> LeaderInfo | None:
        leader = group.view().leader
        return leader if leader is not None and leader.node != node else None

    return probe
