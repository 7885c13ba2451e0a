from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.client import Client
from tests.server.live import LiveServer, live_server
from tests.tiers import starts_servers

SERVER_ENV = {"DQ_EXPIRE_INTERVAL_MS": "50", "DQ_MAX_WAIT_MS": "5000", "DQ_MAX_BATCH": "1000"}


@pytest.fixture(scope="module")
@starts_servers
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq") / "data"
    with live_server(data, env=SERVER_ENV) as s:
        yield s


@pytest.fixture
def dq(server: LiveServer) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:100]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
