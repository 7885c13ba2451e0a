"""Schemathesis against the service's own OpenAPI document, on a live server.

Every generated request (valid and invalid) must get a documented status, never a
5xx, and a body that matches the documented schema. The example count is bounded so
the whole run stays well under two minutes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import checks

from dq.server.app import create_app
from dq.server.settings import Settings
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve

schema = schemathesis.openapi.from_dict(create_app(Settings()).openapi())
# The consumer-group routes (server/routers/consumers.py) get the no-5xx check here and
# the full conformance checks against their own server in test_consumer_routes_fuzz.py.
OTHERS = r"/consumers|/batches"

CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq-fuzz") / "data"
    # Short waits and leases keep generated long-polls cheap.
    env = {"DQ_MAX_WAIT_MS": "20", "DQ_MAX_BATCH": "50", "DQ_MAX_VALUE_BYTES": "4096"}
    with live_server(data, env=env) as s:
        yield s


FUZZ = settings(
    max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


@pytest.mark.timeout(240)
@schema.exclude(path_regex=OTHERS).parametrize()
@FUZZ
def test_api_conforms(case: schemathesis.Case, fuzz_server: LiveServer) -> None:
    case.call_and_validate(base_url=fuzz_server.url, checks=CHECKS)


@pytest.mark.timeout(240)
@schema.include(path_regex=OTHERS).parametrize()
@FUZZ
def test_consumer_routes_never_5xx(case: schemathesis.Case, fuzz_server: LiveServer) -> None:
    case.call_and_validate(base_url=fuzz_server.url, checks=[checks.not_a_server_error])
