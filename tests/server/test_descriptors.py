"""The descriptor budget, with a real server under a real open-file limit.

A server started with ``ulimit -n 128`` may hold at most 64 client connections; the
next is refused with 503 while the server still has descriptors for its logs, so once
the connections go, it serves and writes again (no EMFILE in between).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dq.server.descriptors import connection_budget
from tests.server.live import REPO, free_port

LIMIT = 128
_LIMITED = (
    "import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({n}, {n})); "
    "from dq.cli.main import main; sys.exit(main(sys.argv[1:]))"
)


def test_the_budget_is_half_the_open_file_limit() -> None:
    assert connection_budget(10) == 10
    assert connection_budget(1 << 40) < 1 << 40


def _status(sock: socket.socket) -> int:
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    sock.settimeout(10)
    head = b""
    while b"\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return int(head.split(b" ")[1]) if head else 0


@pytest.fixture
def limited_server(tmp_path: Path) -> object:
    port = free_port()
    cmd = [
        sys.executable, "-c", _LIMITED.format(n=LIMIT), "serve",
        "--data-dir", str(tmp_path / "data"), "--port", str(port), "--fsync", "always",
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("server did not come up")
        yield port, url, tmp_path / "server.log"
    finally:
        proc.kill()
        proc.wait(10)
        log.close()


@pytest.mark.integration
def test_connections_stop_short_of_the_open_file_limit(limited_server: object) -> None:
    port, url, log = limited_server  # type: ignore[misc]
    httpx.post(f"{url}/v1/queues/fd/items", json={"items": [{"value": "before"}]}, timeout=10)
    held: list[socket.socket] = []
    try:
        for _ in range(LIMIT // 2):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            assert _status(extra) == 503
        assert "at most 64 connections" in log.read_text()
    finally:
        for s in held:
            s.close()
    time.sleep(0.5)
    # the server never ran out of descriptors: it writes (a new log, an fsync) and serves
    r = httpx.post(f"{url}/v1/queues/fd2/items", json={"items": [{"value": "after"}]}, timeout=10)
    assert r.status_code == 200, r.text
    got = httpx.post(f"{url}/v1/queues/fd/dequeue", json={"count": 5}, timeout=10).json()
    assert [i["value"] for i in got["items"]] == ["before"]
