"""A real single-member etcd for tests: free ports on 127.0.0.1, a temporary data dir,
killed when the test is done. Tests skip (saying why) where /usr/bin/etcd is missing;
``.ci/run`` installs it (Debian's ``etcd-server``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.server.replication.etcd import EtcdClient, EtcdError
from tests.server.live import free_port
from tests.stopped import sigstop

__all__ = ["EtcdServer", "etcd_binary", "running_etcd"]


def etcd_binary() -> str:
    """The etcd executable, or skip the test saying how to get one."""
    path = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
    if path is None:
        pytest.skip("etcd is not installed (Debian: apt-get install etcd-server)")
    return path


class EtcdServer:
    """One etcd member; ``url`` is its client URL."""

    def __init__(self, data_dir: Path, name: str = "t") -> None:
        self.name = name
        self.data_dir = data_dir
        self.client_port = free_port()
        self.peer_port = free_port()
        self.url = f"http://127.0.0.1:{self.client_port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"etcd-{self.client_port}.log"

    def start(self, timeout: float = 20.0) -> EtcdServer:
        """A single-member cluster, up."""
        self.launch()
        self.wait_up(timeout)
        return self

    def launch(self, initial_cluster: str | None = None) -> None:
        """Start the process (of a cluster named by ``initial_cluster``, else alone)."""
        peer = f"http://127.0.0.1:{self.peer_port}"
        cmd = [
            etcd_binary(),
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", initial_cluster or f"{self.name}={peer}",
            # a short election timeout allows leases of 1 s (etcd's floor is 1.5 x it)
            "--heartbeat-interval", "50", "--election-timeout", "500",
            "--log-level", "warn",
        ]  # fmt: skip
        log = self.log_path.open("ab")
        env = {k: v for k, v in os.environ.items() if not k.startswith("ETCD")}
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def wait_up(self, timeout: float = 20.0) -> None:
        """Wait until a write through this member succeeds (it has a quorum)."""
        assert self.proc is not None
        client = EtcdClient(self.url, timeout_s=0.5)
        give_up = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"etcd exited with {self.proc.returncode}: {self.log()}")
                try:
                    client.put("/dq-test/ready", "1")
                    break
                except EtcdError:
                    if time.monotonic() > give_up:
                        raise RuntimeError(f"etcd not up in {timeout} s: {self.log()}") from None
                    time.sleep(0.1)
        except BaseException:
            self.kill()
            raise
        finally:
            client.close()

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def pause(self) -> None:
        assert self.proc is not None
        sigstop(self.proc.pid)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(timeout=10)


@contextlib.contextmanager
def running_etcd(data_dir: Path) -> Iterator[EtcdServer]:
    server = EtcdServer(data_dir).start()
    try:
        yield server
    finally:
        server.kill()
