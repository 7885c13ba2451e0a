"""Three etcd members and three ``dq serve``, one of each per node namespace, and the
monitor that watches who leads.

etcd runs with ``--heartbeat-interval=100 --election-timeout=1000`` (fast elections on a
shared machine) and ``--pre-vote`` (docs/replication.md: a member back from a partition
does not force an election, which would renew every lease). Each ``dq serve`` gets the replication settings of ``docs/deploy.md``:
``DQ_ETCD`` (its own member first), ``DQ_NODE``, ``DQ_ADVERTISE_URL``, ``fsync always``,
a short leader lease and commit timeout so faults show within a short run, and a small
``DQ_MEMSEG_BYTES`` so logs freeze and segment files merge while faults happen.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.jepsen.history import History
from tests.jepsen.netns import Network, sh
from tests.jepsen.procs import Proc, Supervisor, wait_until

__all__ = ["DQ_PORT", "Cluster", "Monitor"]

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
DQ_PORT = 8080
ETCD_CLIENT, ETCD_PEER = 2379, 2380
LEADER_TTL_S = 2


class Cluster:
    def __init__(
        self, net: Network, sup: Supervisor, data_root: Path, *, memseg: int, replicated: bool
    ) -> None:
        self.net = net
        self.replicated = replicated
        self.sup = sup
        self.data_root = data_root
        self.memseg = memseg
        self.etcd: dict[int, Proc] = {}
        self.dq: dict[int, Proc] = {}
        self.cluster_name = net.prefix

    def url(self, node: int) -> str:
        return f"http://{self.net.addr(node)}:{DQ_PORT}"

    def urls(self) -> list[str]:
        return [self.url(i) for i in self.net.nodes]

    def etcd_url(self, node: int) -> str:
        return f"http://{self.net.addr(node)}:{ETCD_CLIENT}"

    def disk(self, node: int) -> Path:
        """The node's dq disk: a directory, or a size-limited tmpfs (``mount_disks``)."""
        return self.data_root / f"dq-n{node}"

    def data_dir(self, node: int) -> Path:
        return self.disk(node) / "data"

    def mount_disks(self, size_mb: int) -> None:
        """Give each node's dq a tmpfs of its own (in the run's private mount namespace):
        no load on the machine's disk, and a disk that can be filled (``fill_disk``).
        A SIGKILL loses nothing on tmpfs, as on a disk; power loss is not simulated."""
        for i in self.net.nodes:
            self.disk(i).mkdir(parents=True, exist_ok=True)
            sh(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(self.disk(i))])

    def fill_disk(self, node: int) -> int:
        """Fill the node's disk to the last byte; bytes written."""
        chunk, written = b"\0" * (1 << 20), 0
        with (self.disk(node) / "filler").open("wb", buffering=0) as f:
            while True:
                try:
                    written += f.write(chunk)
                except OSError:
                    try:
                        while True:
                            written += f.write(b"\0" * 4096)
                    except OSError:
                        return written

    def free_disks(self) -> None:
        for i in self.net.nodes:
            (self.disk(i) / "filler").unlink(missing_ok=True)

    # etcd ---------------------------------------------------------------------------
    def start_etcd(self, timeout: float = 60.0) -> None:
        peers = ",".join(f"e{i}=http://{self.net.addr(i)}:{ETCD_PEER}" for i in self.net.nodes)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ETCD_UNSUPPORTED_ARCH": ""}
        for i in self.net.nodes:
            a = self.net.addr(i)
            argv = [
                "etcd", "--name", f"e{i}", "--data-dir", str(self.data_root / f"etcd-n{i}"),
                "--listen-client-urls", f"http://{a}:{ETCD_CLIENT},http://127.0.0.1:{ETCD_CLIENT}",
                "--advertise-client-urls", f"http://{a}:{ETCD_CLIENT}",
                "--listen-peer-urls", f"http://{a}:{ETCD_PEER}",
                "--initial-advertise-peer-urls", f"http://{a}:{ETCD_PEER}",
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", self.cluster_name,
                "--heartbeat-interval=100", "--election-timeout=1000", "--pre-vote",
                "--log-level", "warn",
            ]  # fmt: skip
            self.etcd[i] = self.sup.add(f"etcd{i}", self.net.exec_argv(i, argv), env)
            self.etcd[i].start()
        for i in self.net.nodes:
            wait_until(f"etcd member e{i} healthy", lambda i=i: self.etcd_healthy(i), timeout)

    def etcd_healthy(self, node: int) -> bool:
        """The member answers ``/health`` true (it has a leader and serves reads)."""
        try:
            r = httpx.get(self.etcd_url(node) + "/health", timeout=1.0)
            return r.status_code == 200 and r.json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    # dq -----------------------------------------------------------------------------
    def dq_env(self, node: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
        env.update(DQ_MEMSEG_BYTES=str(self.memseg), DQ_SHM="0", DQ_EXPIRE_INTERVAL_MS="100")
        env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack to the log
        if not self.replicated:
            return env
        own = [self.etcd_url(node)] + [self.etcd_url(i) for i in self.net.nodes if i != node]
        env.update(
            DQ_ETCD=",".join(own),
            DQ_NODE=f"n{node}",
            DQ_ADVERTISE_URL=self.url(node),
            DQ_CLUSTER=self.cluster_name,
            DQ_LEADER_TTL_S=str(LEADER_TTL_S),
            DQ_COMMIT_TIMEOUT_MS="3000",
            DQ_REPLICA_TIMEOUT_MS="2000",
        )
        return env

    def start_dq(self, timeout: float = 60.0) -> None:
        for i in self.net.nodes:
            self.data_dir(i).mkdir(parents=True, exist_ok=True)
            argv = [
                sys.executable, "-m", "dq.cli.main", "serve",
                "--data-dir", str(self.data_dir(i)), "--host", self.net.addr(i),
                "--port", str(DQ_PORT), "--fsync", "always", "--log-level", "info",
            ]  # fmt: skip
            self.dq[i] = self.sup.add(f"dq{i}", self.net.exec_argv(i, argv), self.dq_env(i))
            self.dq[i].start()
        for i in self.net.nodes:
            self.wait_dq_up(i, timeout)

    def wait_dq_up(self, node: int, timeout: float = 60.0) -> None:
        proc = self.dq[node]

        def up() -> bool:
            if not proc.alive():
                raise RuntimeError(f"dq{node} exited: {proc.tail()}")
            return httpx.get(self.url(node) + "/healthz", timeout=1.0).status_code == 200

        wait_until(f"dq{node} answering", up, timeout)

    def restart_dq(self, node: int) -> None:
        self.dq[node].start()

    def remove_data(self) -> None:
        for i in self.net.nodes:
            sh(["umount", str(self.disk(i))], check=False)
        shutil.rmtree(self.data_root, ignore_errors=True)


class Monitor:
    """Polls ``GET /v1/cluster`` of every node (one thread each, short timeouts, so a
    paused node delays nobody) and records each new epoch a leader claims."""

    def __init__(self, cluster: Cluster, history: History, every: float = 0.2) -> None:
        self.cluster = cluster
        self.history = history
        self.every = every
        self.state: dict[int, tuple[float, dict[str, Any]]] = {}
        self.highest = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=(i,), name=f"monitor-n{i}", daemon=True)
            for i in cluster.net.nodes
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def _poll(self, node: int) -> None:
        url = self.cluster.url(node) + "/v1/cluster"
        with httpx.Client(timeout=0.5) as http:
            while not self._stop.is_set():
                try:
                    r = http.get(url)
                    doc = r.json() if r.status_code == 200 else None
                    if r.status_code == 404 and not self.cluster.replicated:
                        doc = {"role": "single", "epoch": 0}
                except (httpx.HTTPError, ValueError):
                    doc = None
                if doc is not None:
                    self._seen(node, doc)
                self._stop.wait(self.every)

    def _seen(self, node: int, doc: dict[str, Any]) -> None:
        with self._lock:
            self.state[node] = (time.monotonic(), doc)
            epoch = int(doc.get("epoch") or 0)
            if doc.get("role") == "leader" and epoch > self.highest:
                self.highest = epoch
                self.history.note("epoch", epoch=epoch, node=f"n{node}")
                log.info("leader n%d epoch %d", node, epoch)

    def leader(self, fresh_s: float = 1.5, since: float = 0.0) -> int | None:
        """The node that most recently claimed to lead with the highest epoch, among
        answers of the last ``fresh_s`` seconds given after ``since`` (monotonic)."""
        now = time.monotonic()
        best: tuple[int, int] | None = None
        with self._lock:
            for node, (seen, doc) in self.state.items():
                if now - seen > fresh_s or seen < since:
                    continue
                if doc.get("role") not in ("leader", "single"):
                    continue
                epoch = int(doc.get("epoch") or 0)
                if best is None or epoch > best[0]:
                    best = (epoch, node)
        return best[1] if best is not None else None

    def wait_leader(self, timeout: float, since: float = 0.0) -> int:
        found: list[int] = []

        def probe() -> bool:
            node = self.leader(since=since)
            if node is not None:
                found.append(node)
            return node is not None

        wait_until("a leader", probe, timeout, every=0.05)
        return found[-1]

    def doc(self, node: int) -> dict[str, Any]:
        """The node's last answer to ``GET /v1/cluster`` (empty if none yet)."""
        with self._lock:
            return dict(self.state.get(node, (0.0, {}))[1])

    def describe(self) -> dict[str, Any]:
        with self._lock:
            return {f"n{n}": doc for n, (_, doc) in sorted(self.state.items())}
