"""The dashboard's server side: /v1/history, /v1/server, the /ui files, local Swagger UI,
and the bearer scheme in the OpenAPI document."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import httpx
import pytest

from dq.server.ui import UI_DIR
from dq.shm.attach import attach
from tests.server.in_app import run_in_app
from tests.server.live import live_server


def test_history_fills_at_the_sampling_interval(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        r = await http.post("/v1/queues/a/items", json={"items": [{"value": "x"}] * 3})
        assert r.status_code == 200
        await asyncio.sleep(0.5)
        h = (await http.get("/v1/history", params={"queue": "a", "seconds": 60})).json()
        assert h["tracked"] is True and h["interval_ms"] == 100
        assert len(h["t"]) >= 2 and h["due"][-1] == 3
        total = (await http.get("/v1/history")).json()
        assert total["queue"] is None and total["due"][-1] == 3
        r = await http.get("/v1/history", params={"queue": "nope"})
        assert r.status_code == 404 and r.json()["error"] == "queue_not_found"
        r = await http.get("/v1/history", params={"queue": "bad/name"})
        assert r.status_code == 400
        r = await http.get("/v1/history", params={"seconds": 0})
        assert r.status_code == 422

    run_in_app(tmp_path, call, history_interval_ms=100)


def test_server_view(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        await http.post("/v1/queues/small/items", json={"items": [{"value": "x"}]})
        await http.post("/v1/queues/large/items", json={"items": [{"value": "y" * 5000}]})
        s = (await http.get("/v1/server")).json()
        assert s["data_dir"] == str(tmp_path / "d") and s["fsync"] == "never"
        assert s["version"] != "" and s["queue_count"] == 2 and s["auth"] is False
        assert [q["name"] for q in s["queues"]] == ["large", "small"]  # largest first
        assert s["data_bytes"] == sum(q["bytes_on_disk"] for q in s["queues"]) > 5000
        assert s["disk"]["total"] >= s["disk"]["free"] > 0
        assert s["shm"] == {"enabled": True, "clients": []}  # on by default
        assert s["history"]["max_queues"] == 100

    run_in_app(tmp_path, call)


def test_ui_files_are_served_from_the_package(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        r = await http.get("/ui")
        assert r.status_code in (307, 308) and r.headers["location"].endswith("/ui/")
        page = (await http.get("/ui/")).text
        assert 'id="login"' in page and "app.js" in page
        for path in sorted(UI_DIR.rglob("*.js")):
            rel = path.relative_to(UI_DIR).as_posix()
            r = await http.get(f"/ui/{rel}")
            assert r.status_code == 200 and "javascript" in r.headers["content-type"], rel
            # ES modules import each other by relative path only: nothing from outside.
            for spec in re.findall(r'from "([^"]+)"', r.text):
                assert spec.startswith("."), (rel, spec)

    run_in_app(tmp_path, call)


def test_swagger_ui_is_local_and_declares_bearer(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        page = (await http.get("/docs")).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)""", page) + re.findall(
            r"url: '([^']+)'", page
        )
        assert urls and all(u.startswith("/") for u in urls), urls
        for url in urls:
            assert (await http.get(url)).status_code == 200, url
        doc = (await http.get("/openapi.json")).json()
        scheme = doc["components"]["securitySchemes"]["HTTPBearer"]
        assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
        assert doc["paths"]["/v1/queues"]["get"]["security"] == [{"HTTPBearer": []}]
        assert "security" not in doc["paths"]["/healthz"]["get"]
        assert (await http.get("/redoc")).status_code == 404  # it would need a CDN

    run_in_app(tmp_path, call)


def test_tokens_guard_the_dashboard_reads_not_the_page(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        assert (await http.get("/ui/")).status_code == 200  # the sign-in form
        assert (await http.get("/v1/server")).status_code == 401
        assert (await http.get("/v1/history")).status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert (await http.get("/v1/server", headers=auth)).json()["auth"] is True
        assert (await http.get("/v1/history", headers=auth)).status_code == 200
        assert (await http.get("/v1/session", headers=auth)).json() == {
            "auth": True,
            "role": "admin",
        }

    run_in_app(tmp_path, call, tokens=("s3cret",))


def test_without_tokens_everyone_is_admin(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        assert (await http.get("/v1/session")).json() == {"auth": False, "role": "admin"}

    run_in_app(tmp_path, call)


@pytest.mark.integration
def test_server_view_lists_shm_clients(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", env={"DQ_SHM": "1"}) as server:
        client = attach(server.data_dir, queue="fast", capacity=16)
        try:
            shm = httpx.get(server.url + "/v1/server").json()["shm"]
            assert shm["enabled"] is True
            [mine] = shm["clients"]
            assert mine["pid"] == os.getpid() and mine["queue"] == "fast"
            assert mine["capacity"] == 16 and mine["shm"]
        finally:
            client.close()


@pytest.mark.integration
def test_read_only_tokens_read_and_never_write(tmp_path: Path) -> None:
    """Against a live server: the HTTP fast path must not let a read token enqueue."""
    env = {"DQ_TOKENS": "admin", "DQ_READ_TOKENS": "viewer"}
    with live_server(tmp_path / "data", env=env) as server:
        admin = {"Authorization": "Bearer admin"}
        viewer = {"Authorization": "Bearer viewer"}
        items = {"items": [{"value": "x"}]}
        url = server.url + "/v1/queues/q/items"
        assert httpx.post(url, json=items, headers=admin).status_code == 200
        r = httpx.post(url, json=items, headers=viewer)
        assert r.status_code == 403 and r.json()["error"] == "forbidden"
        for path in ("/dequeue", "/pause"):
            r = httpx.post(server.url + "/v1/queues/q" + path, json={}, headers=viewer)
            assert r.status_code == 403, path
        assert httpx.delete(url, headers=viewer).status_code == 403
        assert httpx.get(server.url + "/v1/queues/q", headers=viewer).json()["stats"]["due"] == 1
        assert httpx.get(server.url + "/metrics", headers=viewer).status_code == 200
        session = httpx.get(server.url + "/v1/session", headers=viewer).json()
        assert session == {"auth": True, "role": "read"}
        assert httpx.get(server.url + "/v1/session", headers=admin).json()["role"] == "admin"
        assert httpx.get(server.url + "/v1/session").status_code == 401


@pytest.mark.integration
def test_read_tokens_alone_still_guard_writes(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", env={"DQ_READ_TOKENS": "viewer"}) as server:
        url = server.url + "/v1/queues/q/items"
        assert httpx.post(url, json={"items": [{"value": "x"}]}).status_code == 401
        r = httpx.post(
            url, json={"items": [{"value": "x"}]}, headers={"Authorization": "Bearer viewer"}
        )
        assert r.status_code == 403
        assert httpx.get(server.url + "/v1/queues").status_code == 401
        assert httpx.post(server.url + "/", content=b"{}").status_code in (400, 403)  # SQS signs
