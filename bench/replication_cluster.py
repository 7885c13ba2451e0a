"""Processes for ``bench/replication.py``: etcd members and ``dq serve`` on 127.0.0.1.

A ``Cluster`` is 1 or 3 etcd members and 3 ``dq serve`` with replication on (one data
directory each, under one throw-away root); a ``Node`` is one ``dq serve``, and
``Node.single`` one without replication. Every process listens on 127.0.0.1 only, is
stopped by its own PID (``close()``, also on error), and every wait is bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.servers import free_port

ETCD = shutil.which("etcd") or "/usr/bin/etcd"
HOST = "127.0.0.1"


def get_json(url: str, path: str, timeout: float = 2.0) -> Any:
    """GET ``url + path`` as JSON; None when the server does not answer 200."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        body = resp.read()
        return json.loads(body) if resp.status == 200 else None
    except (OSError, ValueError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _stop(proc: subprocess.Popen[bytes] | None, sig: int = signal.SIGTERM) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


class Etcd:
    """One etcd member (``--heartbeat-interval 100 --election-timeout 1000``)."""

    def __init__(self, root: Path, name: str) -> None:
        self.name, self.dir = name, root / name
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = f"http://{HOST}:{self.client_port}"
        self.peer_url = f"http://{HOST}:{self.peer_port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, initial_cluster: str) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            ETCD, "--name", self.name, "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", self.peer_url, "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", f"dq-bench-{os.getpid()}",
            "--heartbeat-interval", "100", "--election-timeout", "1000",
            "--log-level", "warn",
        ]  # fmt: skip
        with (self.dir / "etcd.log").open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    def healthy(self) -> bool:
        reply = get_json(self.url, "/health")
        return bool(reply) and reply.get("health") == "true"

    def close(self) -> None:
        _stop(self.proc)


class Node:
    """One ``dq serve --fsync always`` (``DQ_SHM=0``: the bench speaks HTTP only)."""

    def __init__(self, root: Path, name: str, env: dict[str, str]) -> None:
        self.name, self.dir = name, root / name
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    @classmethod
    def single(cls, root: Path) -> Node:
        return cls(root, "single", {})

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
        env.update(self.env, DQ_SHM="0")
        if "DQ_ETCD" in self.env:
            env.update(DQ_NODE=self.name, DQ_ADVERTISE_URL=self.url)
        cmd = [
            sys.executable, "-m", "dq.cli.main", "serve", "--host", HOST,
            "--port", str(self.port), "--data-dir", str(self.dir / "data"),
            "--fsync", "always", "--log-level", "warning",
        ]  # fmt: skip
        with (self.dir / "serve.log").open("ab") as log:
            self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def wait_up(self, timeout: float = 60.0) -> None:
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log()}")
            if get_json(self.url, "/healthz") is not None:
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not up after {timeout:.0f} s: {self.log()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def kill(self) -> None:
        """SIGKILL: a crash, as the failover measurement wants it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / "serve.log").read_text(errors="replace")[-3000:]
        return ""

    def close(self) -> None:
        _stop(self.proc)


class Cluster:
    """``etcd_members`` etcd members and ``members`` (three) replicated ``dq serve``."""

    def __init__(
        self, root: Path, etcd_members: int, env: dict[str, str], members: int = 3
    ) -> None:
        self.etcds = [Etcd(root, f"etcd{i + 1}") for i in range(etcd_members)]
        endpoints = ",".join(e.url for e in self.etcds)
        env = {"DQ_ETCD": endpoints, "DQ_CLUSTER": f"bench{os.getpid()}", **env}
        self.nodes = [Node(root, f"n{i + 1}", env) for i in range(members)]
        self.urls = [n.url for n in self.nodes]

    def start(self, timeout: float = 60.0) -> None:
        peers = ",".join(f"{e.name}={e.peer_url}" for e in self.etcds)
        for e in self.etcds:
            e.start(peers)
        give_up = time.monotonic() + timeout
        while not all(e.healthy() for e in self.etcds):
            if time.monotonic() > give_up:
                raise RuntimeError("etcd not healthy in time")
            time.sleep(0.1)
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            n.wait_up(max(1.0, give_up - time.monotonic()))

    def views(self) -> dict[str, Any]:
        """``GET /v1/cluster`` of every node that answers, by node name."""
        seen = {}
        for n in self.nodes:
            view = get_json(n.url, "/v1/cluster", timeout=1.0)
            if view is not None:
                seen[n.name] = view
        return seen

    def leader(self) -> Node | None:
        """The node every answering member agrees leads, if it says so itself."""
        leaders = [name for name, v in self.views().items() if v.get("role") == "leader"]
        return next((n for n in self.nodes if [n.name] == leaders), None)

    def wait_in_sync(self, members: int = 3, timeout: float = 60.0) -> Node:
        """Wait until one leader has ``members`` in its sync set; returns the leader."""
        give_up = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < give_up:
            last = self.views()
            for n in self.nodes:
                v = last.get(n.name, {})
                if v.get("role") == "leader" and len(v.get("sync") or []) >= members:
                    return n
            time.sleep(0.1)
        raise RuntimeError(f"no leader with {members} members in sync in {timeout:.0f} s: {last}")

    def close(self) -> None:
        for n in self.nodes:
            n.close()
        for e in self.etcds:
            e.close()
