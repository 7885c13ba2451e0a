"""A leader whose group cannot commit answers 503 ``replication_timeout`` and then
``replication_stalled``: conditions of every failover, answered in full, so the server
logs them as warnings and keeps ``ERROR`` for what needs looking at. A real ``dq serve``
leads alone in a real etcd with ``--min-insync 2``: no write can commit. Its replication
settings are given as ``dq serve`` flags."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.replication.etcd_server import EtcdServer
from tests.server.live import LiveServer, free_port, live_server

# integration: a dq serve member and etcd
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture
def lone_leader(tmp_path: Path, etcd: EtcdServer, cluster: str) -> Iterator[LiveServer]:
    port = free_port()
    # the replication settings as dq serve flags (the default commit timeout is 10 s)
    args = [
        "--etcd", etcd.url, "--node", "n1", "--cluster", cluster,
        "--advertise-url", f"http://127.0.0.1:{port}", "--leader-ttl-s", "1",
        "--min-insync", "2", "--commit-timeout-ms", "300", "--replica-timeout-ms", "1000",
        "--replica-window-bytes", str(2 << 20), "--no-shm",
    ]  # fmt: skip
    with live_server(tmp_path / "data", fsync="always", port=port, args=args) as server:
        yield server


def _leading(c: httpx.Client) -> bool:
    return bool(c.get("/v1/cluster").json()["role"] == "leader")


def _refusal(c: httpx.Client, method: str, path: str, body: object, code: str) -> float:
    """Send the write until it is answered 503 ``code`` (at most 20 s); how long the
    last request took."""
    give_up = time.monotonic() + 20
    seen: list[str] = []
    while time.monotonic() < give_up:
        t0 = time.monotonic()
        answer = c.request(method, path, json=body)
        took = time.monotonic() - t0
        assert answer.status_code == 503, answer.text
        seen.append(answer.json()["error"])
        if seen[-1] == code:
            return took
    raise AssertionError(f"no 503 {code} within 20 s: {seen}")


def test_commit_timeouts_and_stalls_are_logged_as_warnings(lone_leader: LiveServer) -> None:
    with httpx.Client(base_url=lone_leader.url, timeout=10) as c:
        give_up = time.monotonic() + 30
        while not _leading(c):
            assert time.monotonic() < give_up, "the lone member never led"
            time.sleep(0.05)
        item = {"items": [{"value": "x"}]}
        # the HTTP fast path (enqueue) and a FastAPI route (queue config) both answer so
        took = _refusal(c, "POST", "/v1/queues/q/items", item, "replication_timeout")
        assert took < 5.0, took  # --commit-timeout-ms 300 reached the server
        _refusal(c, "POST", "/v1/queues/q/items", item, "replication_stalled")
        _refusal(c, "PUT", "/v1/queues/q", {"default_lease_ms": 5000}, "replication_timeout")
    log = lone_leader.log_path.read_text(errors="replace")
    answered = [line for line in log.splitlines() if "dq.server.errors" in line]
    timeouts = [line for line in answered if "replication_timeout" in line]
    stalls = [line for line in answered if "replication_stalled" in line]
    assert timeouts and stalls, log[-3000:]
    assert any("PUT /v1/queues/q" in line for line in timeouts), log[-3000:]
    levels = {
        m.group(1) for line in answered if (m := re.search(r" (\w+) dq\.server\.errors", line))
    }
    assert levels == {"WARNING"}, "\n".join(answered[-10:])
