"""Limits that keep one client from hurting the others, against live servers.

Body limit before the body is read, auth before the body, the batch limit while
parsing, header and body read timeouts, the connection cap, a responsive /healthz while
a huge body streams in, and the settings that must never silently turn auth off.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.client import Client
from dq.server.app import create_app
from dq.server.settings import Settings
from dq.storage import fileio
from tests.server.in_app import app_client
from tests.server.live import REPO, LiveServer, free_port, live_server
from tests.stopped import sigstop

pytestmark = pytest.mark.integration  # live dq serve processes

ENV = {
    "DQ_TOKENS": "sesame",
    "DQ_MAX_BATCH": "1000",
    "DQ_HEADER_TIMEOUT_S": "1",
    "DQ_BODY_TIMEOUT_S": "1.5",
    "DQ_MAX_CONNECTIONS": "8",
}
AUTH = "authorization: Bearer sesame\r\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq-hostile") / "data", env=ENV) as s:
        yield s


def _connect(server: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _answer(sock: socket.socket) -> tuple[int, bytes]:
    """Status and everything the server sent until it closed or paused."""
    data = b""
    sock.settimeout(10)
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            while len(rest) < int(line.split(b":")[1]):
                rest += sock.recv(65536)
    return int(data.split(b" ", 2)[1]), head + b"\r\n\r\n" + rest


def _head(path: str, length: int, auth: str = AUTH) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n{auth}\r\n"
    ).encode()


def test_body_over_the_limit_is_refused_before_it_is_sent(server: LiveServer) -> None:
    with _connect(server) as s:
        s.sendall(_head("/v1/queues/q/items", 200 << 20))  # 200 MiB announced, none sent
        status, raw = _answer(s)
    assert status == 413 and b'"body_too_large"' in raw


def test_unauthenticated_body_is_refused_before_it_is_read(server: LiveServer) -> None:
    for path in ("/v1/queues/q/items", "/v1/queues/q/requeue", "/metrics"):
        with _connect(server) as s:
            s.sendall(_head(path, 10 << 20, auth=""))  # junk would follow; it is not read
            status, raw = _answer(s)
        assert status == 401 and b'"unauthorized"' in raw, path


def test_batch_limit_is_enforced_while_parsing(server: LiveServer) -> None:
    huge = json.dumps({"items": [{"value": ""}] * 2_000_000}).encode()  # ~28 MiB
    release = json.dumps({"items": [{"id": 1, "receipt": "r"}] * 1001}).encode()
    dequeue = json.dumps({"count": 1, "release": [{"id": 1, "receipt": "r"}] * 1001}).encode()
    headers = {"authorization": "Bearer sesame", "content-type": "application/json"}
    for path, body in (("items", huge), ("release", release), ("dequeue", dequeue)):
        r = httpx.post(f"{server.url}/v1/queues/q/{path}", content=body, headers=headers)
        assert r.status_code == 413, (path, r.text)
        assert r.json() == {
            "error": "batch_too_large",
            "message": "more than 1000 items in one request; the limit is 1000",
        }

    def chunked() -> Iterator[bytes]:  # the framework's path applies the same limit
        yield huge

    r = httpx.post(f"{server.url}/v1/queues/q/items", content=chunked(), headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "batch_too_large"


def test_healthz_answers_while_a_huge_body_streams_in(server: LiveServer) -> None:
    body = json.dumps({"items": [{"value": "x" * 1000}] * 30_000}).encode()  # ~30 MiB
    with _connect(server) as s:
        s.sendall(_head("/v1/queues/q/items", len(body)))
        step = 1 << 20
        for n in range(0, len(body) - step, step):
            s.sendall(body[n : n + step])
            if n == 10 * step:
                assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200
        s.sendall(body[n + step :])
        status, _ = _answer(s)
    assert status == 413  # 30,000 items: over the batch limit
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200


def test_slow_headers_and_slow_bodies_are_cut_off(server: LiveServer) -> None:
    with _connect(server) as s:
        s.sendall(b"POST /v1/queues/q/items HTTP/1.1\r\nhost: x\r\n")  # and then nothing
        status, raw = _answer(s)
        assert s.recv(1) == b""  # closed
    assert status == 408 and b"headers took longer than 1 s" in raw
    with _connect(server) as s:
        s.sendall(_head("/v1/queues/q/items", 100) + b'{"items": [')
        status, raw = _answer(s)
        assert s.recv(1) == b""
    assert status == 408 and b"body took longer than 1.5 s" in raw


def test_connections_over_the_cap_are_refused(server: LiveServer) -> None:
    held = [_connect(server) for _ in range(8)]
    try:
        time.sleep(0.3)
        with _connect(server) as extra:
            status, raw = _answer(extra)
        assert status == 503 and b"too_many_connections" in raw
    finally:
        for s in held:
            s.close()
    time.sleep(0.3)
    assert httpx.get(server.url + "/healthz", timeout=5).status_code == 200


def test_a_long_poll_waits_for_a_queue_that_does_not_exist_yet(server: LiveServer) -> None:
    headers = {"authorization": "Bearer sesame"}
    answers: list[httpx.Response] = []

    def wait() -> None:
        body = {"count": 1, "wait_ms": 5000}
        url = f"{server.url}/v1/queues/not-yet/dequeue"
        answers.append(httpx.post(url, json=body, headers=headers, timeout=10))

    waiter = threading.Thread(target=wait)
    t0 = time.monotonic()
    waiter.start()
    time.sleep(0.5)  # the long-poll is parked on a queue nobody created
    r = httpx.post(
        f"{server.url}/v1/queues/not-yet/items", json={"items": [{"value": "hi"}]}, headers=headers
    )
    assert r.status_code == 200
    waiter.join(10)
    (answer,) = answers
    assert answer.status_code == 200 and [i["value"] for i in answer.json()["items"]] == ["hi"]
    assert time.monotonic() - t0 < 4  # woken by the creation, not by the end of the wait


def test_an_escaped_slash_in_a_path_reaches_no_route(server: LiveServer) -> None:
    """A name holding ``/`` would be routed as more path once decoded: the purge of
    ``q/items`` would purge ``q``, the stats of ``q/items/1`` read item 1."""
    headers = {"authorization": "Bearer sesame"}
    base = f"{server.url}/v1/queues"
    r = httpx.post(f"{base}/slashed/items", json={"items": [{"value": "keep"}]}, headers=headers)
    assert r.status_code == 200
    for method, path in [
        ("DELETE", "/slashed%2Fitems"),
        ("DELETE", "/slashed%2fitems%2F1"),
        ("GET", "/slashed%2Fitems"),
        ("POST", "/slashed%2Fitems/dequeue"),
    ]:
        r = httpx.request(method, base + path, headers=headers, json={"count": 1})
        assert (r.status_code, r.json()["error"]) == (400, "invalid_queue_name"), path
    r = httpx.delete(f"{base}/slashed/items/1%2F", headers=headers)
    assert (r.status_code, r.json()["error"]) == (404, "not_found")
    # nothing was purged, deleted or leased; a query may still escape a slash
    r = httpx.get(f"{base}/slashed/items?state=due&after=a%2Fb", headers=headers)
    assert r.status_code in (200, 400) and r.json().get("error") != "not_found"
    stats = httpx.get(f"{base}/slashed", headers=headers).json()["stats"]
    assert (stats["pending"], stats["leased"]) == (1, 0)


@pytest.mark.parametrize("tokens", [",", "a,,b", " , "])
def test_empty_tokens_are_refused(tmp_path: Path, tokens: str) -> None:
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(tmp_path / "d")]
    cmd += ["--port", str(free_port()), "--tokens", tokens]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "empty token" in done.stderr


def test_a_public_bind_without_tokens_logs_a_warning(tmp_path: Path) -> None:
    with live_server(tmp_path / "d", env={"DQ_HOST": "0.0.0.0"}) as s:
        assert httpx.get(s.url + "/healthz").status_code == 200
        log = s.log()
    assert "without tokens" in log and "0.0.0.0" in log


def test_a_failed_fsync_answers_503_from_the_first_request(tmp_path: Path) -> None:
    def broken(step: str, path: str) -> None:
        if step == "fsync" and path.endswith(".log"):
            raise OSError(5, "Input/output error")

    app = create_app(Settings(data_dir=str(tmp_path / "d"), fsync="always"))

    async def run() -> list[httpx.Response]:
        async with app_client(app) as http:
            await http.put("/v1/queues/q", json={})
            fileio.FAULTS.append(broken)
            try:
                body = {"items": [{"value": "x"}]}
                return [await http.post("/v1/queues/q/items", json=body) for _ in range(2)]
            finally:
                fileio.FAULTS.remove(broken)

    answers = asyncio.run(run())
    assert [r.status_code for r in answers] == [503, 503]
    assert all(r.json()["error"] == "unavailable" for r in answers)
    assert answers[0].headers["retry-after"] == "1"


def test_a_queue_is_created_off_the_event_loop(tmp_path: Path) -> None:
    """Creating a queue syncs several files: never on the thread that serves everyone."""
    synced_on: list[str] = []

    def record(step: str, path: str) -> None:
        if step == "fsync":
            synced_on.append(threading.current_thread().name)

    app = create_app(Settings(data_dir=str(tmp_path / "d"), fsync="always"))

    async def run() -> int:
        async with app_client(app) as http:
            fileio.FAULTS.append(record)
            try:
                body = {"items": [{"value": "first"}]}
                return (await http.post("/v1/queues/brand-new/items", json=body)).status_code
            finally:
                fileio.FAULTS.remove(record)

    loop_thread = threading.current_thread().name
    assert asyncio.run(run()) == 200
    assert synced_on and loop_thread not in synced_on


def test_a_connection_that_sends_nothing_is_closed(server: LiveServer) -> None:
    with _connect(server) as s:
        s.settimeout(15)
        t0 = time.monotonic()
        assert s.recv(1) == b""  # closed by the server, nothing answered
    assert time.monotonic() - t0 < 14


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/queues/idle/items", b'{"items": [{"value": "a"}]}'),  # the fast path answers
        ("/v1/queues/idle/items", b'{"items": []}'),  # the framework answers (422)
    ],
)
def test_an_idle_keep_alive_connection_is_closed(
    server: LiveServer, path: str, body: bytes
) -> None:
    """After an answer the connection stays open for the next request, then is closed
    once idle past the keep-alive timeout (5 s, checked each second)."""
    with _connect(server) as s:
        s.sendall(_head(path, len(body)) + body)
        status, _ = _answer(s)
        assert status in (200, 422)
        t0 = time.monotonic()
        s.settimeout(15)
        assert s.recv(1) == b""  # closed by the server
        waited = time.monotonic() - t0
    assert 4 < waited < 8


def test_a_request_sent_while_the_server_was_paused_is_answered(tmp_path: Path) -> None:
    """A server woken from a pause longer than the keep-alive timeout (SIGSTOP, a frozen
    VM: a replica group's leader paused past its lease) answers the request a client
    sent on a kept-alive connection meanwhile; it reset that connection, so the client
    could not tell whether its enqueue was done."""
    with live_server(tmp_path / "data") as server, Client(server.url, retries=0) as dq:
        assert server.proc is not None
        assert dq.enqueue("paused", b"warm") == 1  # the connection is kept alive
        time.sleep(0.5)  # the server waits in epoll: woken, it runs its timers first
        sigstop(server.proc.pid)
        wake = threading.Timer(6.5, server.proc.send_signal, (signal.SIGCONT,))
        wake.start()  # past the keep-alive timeout (5 s)
        try:
            assert dq.enqueue("paused", b"sent during the pause") == 2
        finally:
            wake.join()
