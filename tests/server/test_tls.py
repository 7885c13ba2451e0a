"""Native HTTPS: ``DQ_TLS_CERT``/``DQ_TLS_KEY`` and the fast path behind them."""

from __future__ import annotations

import http.client
import json
import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="needs the openssl command for a certificate"
)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    base: Path = tmp_path_factory.mktemp("dq-tls")
    cert, key = base / "cert.pem", base / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    env = {"DQ_TLS_CERT": str(cert), "DQ_TLS_KEY": str(key)}
    with live_server(base / "data", env=env) as server:
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
