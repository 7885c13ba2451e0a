"""Live ``dq serve`` processes and real SQS clients pointed at them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from tests.server.live import LiveServer, live_server
from tests.tiers import starts_servers

SERVER_ENV = {"DQ_EXPIRE_INTERVAL_MS": "50", "DQ_MAX_WAIT_MS": "20000"}
#: Dummy credentials: without DQ_TOKENS the server checks no signature.
CREDENTIALS = {"aws_access_key_id": "dq-test", "aws_secret_access_key": "not-checked"}


def sqs_client(url: str, **credentials: str) -> Any:
    """A boto3 SQS client for ``url`` that never retries (errors surface at once)."""
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}, read_timeout=30),
        **(credentials or CREDENTIALS),
    )


@pytest.fixture(scope="module")
@starts_servers
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq") / "data"
    with live_server(data, env=SERVER_ENV) as s:
        yield s


@pytest.fixture
def sqs(server: LiveServer) -> Any:
    return sqs_client(server.url)


@pytest.fixture
def qname(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:70]
