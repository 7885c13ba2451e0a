"""A real ``dq serve`` subprocess on 127.0.0.1 for end-to-end tests.

Every wait has a timeout; ``stop()`` sends SIGTERM and falls back to SIGKILL, so a test
never leaves a server behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from dq.client import Client
from tests.tiers import starts_servers

__all__ = ["LiveServer", "browse_all", "call", "free_port", "live_server", "ok", "served"]

REPO = Path(__file__).resolve().parents[2]


#: every port free_port has handed out in this process
_handed_out: set[int] = set()


def free_port() -> int:
    """A port of 127.0.0.1 free now and never handed out before in this process. Tests
    take several before their servers bind them (a replica group's three members, an
    etcd's client and peer ports), and the kernel gives a closed socket's port out again:
    of 20,000 draws here, 9 runs of six in a row held one port twice."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise RuntimeError("no port free that was not handed out before")


class LiveServer:
    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: str = "never",
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        args: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        #: more ``dq serve`` flags
        self.args = list(args)
        self.fsync = fsync
        self.port = port or free_port()
        self.env = dict(env or {})
        #: With ``DQ_TLS_CERT`` set the server speaks HTTPS; its certificate is the CA.
        cert = self.env.get("DQ_TLS_CERT")
        self.verify: ssl.SSLContext | bool = (
            True if cert is None else ssl.create_default_context(cafile=cert)
        )
        scheme = "http" if cert is None else "https"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 30.0) -> LiveServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
        env.update(self.env)
        cmd = [
            sys.executable, "-m", "dq.cli.main", "serve",
            "--data-dir", str(self.data_dir), "--port", str(self.port), "--fsync", self.fsync,
            "--log-level", "warning", *self.args,
        ]  # fmt: skip
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        give_up = time.monotonic() + timeout
        try:
            self._wait_up(give_up)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_up(self, give_up: float) -> None:
        assert self.proc is not None
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                probe = httpx.get(self.url + "/healthz", timeout=1.0, verify=self.verify)
                if probe.status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"server did not come up in time: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful drain); returns the exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@contextlib.contextmanager
def live_server(data_dir: Path, **options: object) -> Iterator[LiveServer]:
    server = LiveServer(data_dir, **options)  # type: ignore[arg-type]
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(subprocess.TimeoutExpired):
            server.terminate(timeout=15)
        server.kill()


def served(env: Mapping[str, str]) -> tuple[Any, Any]:
    """A module's fixtures ``server``, one live ``dq serve`` with ``env`` that all the
    module's tests share (started for the first, stopped after the last), and a
    ``Client`` of it over HTTP for each test. A module binds them to its names:
    ``server, http = served(ENV)``."""

    @pytest.fixture(scope="module")
    @starts_servers
    def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
        with live_server(tmp_path_factory.mktemp("dq") / "data", env=env) as s:
            yield s

    @pytest.fixture
    def http(server: LiveServer) -> Iterator[Client]:
        with Client(server.url) as c:
            yield c

    return server, http


def call(server: LiveServer, method: str, path: str, **kw: Any) -> httpx.Response:
    """One request to ``server`` as curl would send it (``path`` from the root, ``kw``
    as httpx takes them: ``json=``, ``params=``), with a timeout."""
    return httpx.request(method, server.url + path, timeout=30, **kw)


def ok(r: httpx.Response) -> Any:
    """The JSON body of an answer that must be 200 (else the test fails showing it)."""
    assert r.status_code == 200, r.text
    return r.json()


def browse_all(url: str, queue: str, **params: object) -> list[dict[str, Any]]:
    """Every item of ``queue`` on the server at ``url``, browsed a page of 1,000 at a time
    (``GET /v1/queues/{queue}/items`` with ``params``, e.g. ``values="true"``)."""
    out: list[dict[str, Any]] = []
    after: str | None = None
    for _ in range(1000):
        query: dict[str, Any] = {"limit": 1000, **params}
        if after:
            query["after"] = after
        r = httpx.get(f"{url}/v1/queues/{queue}/items", params=query, timeout=30)
        assert r.status_code == 200, r.text
        page = r.json()
        out += page["items"]
        after = page["next"]
        if after is None:
            return out
    raise AssertionError("browse did not end")
