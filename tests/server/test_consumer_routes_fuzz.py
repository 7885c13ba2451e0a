"""Schemathesis over the consumer and keyed-batch routes: every answer is documented.

``tests/server/test_openapi_fuzz.py`` only checks these routes for 5xx; here they get the
full conformance checks (status codes, content types, response schemas).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from dq.server.app import create_app
from dq.server.settings import Settings
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"DQ_MAX_WAIT_MS": "20", "DQ_MAX_BATCH": "50", "DQ_MAX_VALUE_BYTES": "4096"}
    with live_server(tmp_path_factory.mktemp("dq-fuzz") / "data", env=env) as s:
        yield s


@pytest.mark.timeout(240)
@schema.include(path_regex=r"/consumers|/batches").parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_consumer_routes_conform(case: schemathesis.Case[Any], fuzz_server: LiveServer) -> None:
    case.call_and_validate(base_url=fuzz_server.url, checks=CHECKS)
