from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.server.live import served

SERVER_ENV = {"DQ_EXPIRE_INTERVAL_MS": "50", "DQ_MAX_WAIT_MS": "5000", "DQ_MAX_BATCH": "1000"}


server, dq = served(SERVER_ENV)


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:100]


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
