"""The app factory and lifespan: engine ownership, 503 outside the lifespan, shm plug-in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from dq.server.app import create_app
from dq.server.settings import Settings
from dq.storage import Engine, EngineConfig, NewItem
from tests.server.live import LiveServer, live_server


async def _get(app: object, path: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://dq") as http:
        return await http.get(path)


def test_a_given_engine_is_left_open(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never", compaction="inline")) as engine:
        app = create_app(Settings(data_dir=str(tmp_path / "unused")), engine)

        async def run() -> int:
            async with app.router.lifespan_context(app):
                return (await _get(app, "/healthz")).status_code

        assert asyncio.run(run()) == 200
        engine.enqueue("q", [NewItem(b"still open")])  # the lifespan did not close it
        assert engine.stats("q").pending == 1
    assert not (tmp_path / "unused").exists()


def test_an_owned_engine_is_closed(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=str(tmp_path / "d"), fsync="never"))

    async def run() -> None:
        async with app.router.lifespan_context(app):
            pass

    asyncio.run(run())
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never")):  # the lock was released
        pass


def test_outside_the_lifespan_routes_answer_503(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=str(tmp_path / "d")))
    r = asyncio.run(_get(app, "/v1/queues"))
    assert r.status_code == 503 and r.json()["error"] == "unavailable"


@pytest.mark.integration
def test_shm_server_starts_beside_http(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", env={"DQ_SHM": "1"}).start()
    try:
        assert (tmp_path / "data" / "dq.sock").is_socket()
        assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
    finally:
        assert server.terminate() == 0


@pytest.mark.integration
def test_shared_memory_is_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    from dq.cli.main import build_parser
    from dq.client import Client, TransportError

    with (
        live_server(tmp_path / "on") as server,  # no DQ_SHM: the default
        Client(f"shm://{server.data_dir}") as dq,
    ):
        item_id = dq.enqueue("local", b"x")
        assert [i.id for i in dq.dequeue("local")] == [item_id]
    with live_server(tmp_path / "off", env={"DQ_SHM": "0"}) as server:
        assert not (server.data_dir / "dq.sock").exists()
        with pytest.raises(TransportError):
            Client(f"shm://{server.data_dir}", timeout=2)
    assert build_parser().parse_args(["serve", "--no-shm"]).shm is False


@pytest.mark.integration
def test_a_data_dir_shared_memory_cannot_serve_is_served_over_http(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "data"  # too long for the attach socket
    deep.parent.mkdir(parents=True)
    with live_server(deep) as server:
        assert httpx.get(server.url + "/healthz").json()["status"] == "ok"
        assert not (deep / "dq.sock").exists()
        assert "shared memory not served" in server.log()
