"""A request cancelled while its write waits for fsync must not break the group commit."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.server.app import create_app
from dq.server.settings import Settings
from dq.storage import fileio
from tests.server.in_app import app_client


@pytest.fixture
def slow_fsync() -> Iterator[None]:
    def hook(step: str, path: str) -> None:
        if step == "fsync" and path.endswith(".log"):
            time.sleep(0.3)  # in the syncer thread: the write waits here

    fileio.FAULTS.append(hook)
    try:
        yield
    finally:
        fileio.FAULTS.remove(hook)


def test_cancelled_enqueue_leaves_the_others_alone(tmp_path: Path, slow_fsync: None) -> None:
    app = create_app(Settings(data_dir=str(tmp_path / "d"), fsync="always"))

    async def run() -> tuple[int, int]:
        async with app_client(app) as http:
            await http.put("/v1/queues/q", json={})

            def post(value: str) -> asyncio.Task[httpx.Response]:
                body = {"items": [{"value": value}]}
                return asyncio.create_task(http.post("/v1/queues/q/items", json=body))

            first = post("first")  # its fsync holds the syncer for 0.3 s ...
            await asyncio.sleep(0.05)
            doomed, kept = post("doomed"), post("kept")  # ... so these share the next one
            await asyncio.sleep(0.4)  # that next fsync is under way
            doomed.cancel()
            responses = [await asyncio.wait_for(t, 10) for t in (first, kept, post("after"))]
            stats = (await http.get("/v1/queues/q")).json()["stats"]
            return [r.status_code for r in responses], stats["pending"]

    statuses, pending = asyncio.run(run())
    assert statuses == [200, 200, 200]
    assert pending == 4  # the cancelled request's write happened anyway
