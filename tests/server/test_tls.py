"""Native HTTPS: ``DQ_TLS_CERT``/``DQ_TLS_KEY`` and the fast path behind them."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.client import AsyncClient, Client, TransportError
from tests.server.certificate import NEEDS_OPENSSL, self_signed
from tests.server.live import LiveServer, live_server

# integration: a live dq serve over HTTPS
pytestmark = [pytest.mark.integration, NEEDS_OPENSSL]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("dq-certs"))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory, certs: tuple[Path, Path]) -> Iterator[LiveServer]:
    cert, key = certs
    env = {"DQ_TLS_CERT": str(cert), "DQ_TLS_KEY": str(key)}
    with live_server(tmp_path_factory.mktemp("dq-tls") / "data", env=env) as server:
        yield server


def _post(conn: http.client.HTTPSConnection, path: str, doc: object) -> tuple[int, object]:
    conn.request("POST", path, json.dumps(doc), {"content-type": "application/json"})
    r = conn.getresponse()
    return r.status, json.loads(r.read())


def test_hot_routes_over_https(tls: LiveServer) -> None:
    assert isinstance(tls.verify, ssl.SSLContext)
    conn = http.client.HTTPSConnection("127.0.0.1", tls.port, context=tls.verify, timeout=10)
    try:
        status, doc = _post(conn, "/v1/queues/secure/items", {"items": [{"value": "s"}]})
        assert status == 200
        status, doc = _post(conn, "/v1/queues/secure/dequeue", {"count": 1})
        assert status == 200
        (item,) = doc["items"]  # type: ignore[index]
        assert item["value"] == "s"
        release = {"count": 1, "release": [{"id": item["id"], "receipt": item["receipt"]}]}
        status, doc = _post(conn, "/v1/queues/secure/dequeue", release)
        assert status == 200 and doc == {"items": [], "released": [{"id": item["id"], "ok": True}]}
        status, doc = _post(conn, "/v1/queues/secure/items", {"items": []})  # the framework
        assert status == 422
    finally:
        conn.close()
    r = httpx.get(tls.url + "/v1/queues/secure", verify=tls.verify)
    assert r.status_code == 200 and r.json()["stats"]["pending"] == 0


def test_plain_http_is_not_served(tls: LiveServer) -> None:
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{tls.port}/healthz", timeout=5)


def test_the_client_over_https(tls: LiveServer) -> None:
    with Client(tls.url, ssl_context=tls.verify, timeout=10) as dq:
        item_id = dq.enqueue("client-tls", b"s")
        (item,) = dq.dequeue("client-tls")
        assert item.id == item_id and item.value == b"s"
        got = dq.dequeue("client-tls", release=[item])
        assert list(got) == [] and got.released[0].ok


def test_the_client_over_https_times_out_when_no_answer_comes(certs: tuple[Path, Path]) -> None:
    """Over plain TCP the client's timeout is the kernel's (``SO_RCVTIMEO``); under TLS
    it keeps Python's socket timeout (its ssl layer retries a read the kernel timed
    out), so a request nobody answers still ends at the timeout, as ``Lost``."""
    cert, key = certs
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def never_answer() -> None:
        conn, _ = listener.accept()
        conn.settimeout(10)
        tconn = server_side.wrap_socket(conn, server_side=True)
        held.append(tconn)
        tconn.recv(65536)  # the request; no answer follows

    thread = threading.Thread(target=never_answer, daemon=True)
    thread.start()
    verify = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with Client(url, ssl_context=verify, timeout=0.5, retries=0) as dq:
            t0 = time.monotonic()
            with pytest.raises(TransportError, match=r"no answer within 0\.5 s"):
                dq.enqueue("q", b"x")
            assert time.monotonic() - t0 < 5
    finally:
        thread.join(10)
        for c in held:
            c.close()
        listener.close()


def test_the_async_client_over_https(tls: LiveServer) -> None:
    """The asyncio client reads into its own buffer, under TLS too; an answer larger
    than that buffer comes in several reads."""
    value = bytes(range(256)) * 400  # 100 KiB, sent as base64: more than one read

    async def run() -> None:
        async with AsyncClient(tls.url, ssl_context=tls.verify, timeout=10) as dq:
            item_id = await dq.enqueue("async-tls", value)
            (item,) = await dq.dequeue("async-tls")
            assert item.id == item_id and item.value == value
            got = await dq.dequeue("async-tls", release=[item])
            assert list(got) == [] and got.released[0].ok

    asyncio.run(asyncio.wait_for(run(), 30))
