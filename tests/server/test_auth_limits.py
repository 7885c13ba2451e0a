"""Bearer tokens and body limits, against a live server configured for them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.client import Client, Unauthorized
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data: Path = tmp_path_factory.mktemp("dq-auth") / "data"
    env = {"DQ_TOKENS": "alpha,beta", "DQ_MAX_BODY_BYTES": "4096", "DQ_MAX_BATCH": "10"}
    with live_server(data, env=env) as s:
        yield s


def test_no_token_is_401(guarded: LiveServer) -> None:
    r = httpx.post(guarded.url + "/v1/queues/q/items", json={"items": [{"value": "x"}]})
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.get(guarded.url + "/v1/queues", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401
    with Client(guarded.url) as dq, pytest.raises(Unauthorized):
        dq.queues()


def test_any_configured_token_works(guarded: LiveServer) -> None:
    for token in ("alpha", "beta"):
        with Client(guarded.url, token=token) as dq:
            dq.enqueue("q", b"x")
            assert dq.queue("q").stats.pending >= 1


def test_healthz_needs_no_token_metrics_does(guarded: LiveServer) -> None:
    assert httpx.get(guarded.url + "/healthz").status_code == 200
    assert httpx.get(guarded.url + "/openapi.json").status_code == 200
    r = httpx.get(guarded.url + "/metrics")  # it names the queues
    assert r.status_code == 401 and r.json()["error"] == "unauthorized"
    r = httpx.get(guarded.url + "/metrics", headers={"Authorization": "Bearer beta"})
    assert r.status_code == 200 and "dq_requests_total" in r.text


def test_body_and_batch_limits(guarded: LiveServer) -> None:
    headers = {"Authorization": "Bearer alpha"}
    url = guarded.url + "/v1/queues/q/items"
    r = httpx.post(url, json={"items": [{"value": "x" * 5000}]}, headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
    r = httpx.post(url, json={"items": [{"value": "x"}] * 11}, headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "batch_too_large"
    release = [{"id": n, "receipt": "r"} for n in range(11)]
    r = httpx.post(guarded.url + "/v1/queues/q/release", json={"items": release}, headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "batch_too_large"
    r = httpx.post(guarded.url + "/v1/queues/q/release", json={"items": release[:1]})
    assert r.status_code == 401  # the fast path does not skip auth
    r = httpx.post(guarded.url + "/v1/queues/q/dequeue", json={"count": 11}, headers=headers)
    assert r.status_code == 422 and r.json()["message"] == "count must be between 1 and 10"


def test_chunked_body_is_counted(guarded: LiveServer) -> None:
    def body() -> Iterator[bytes]:
        yield b'{"items": [{"value": "'
        yield b"x" * 5000
        yield b'"}]}'

    headers = {"Authorization": "Bearer alpha", "content-type": "application/json"}
    r = httpx.post(guarded.url + "/v1/queues/q/items", content=body(), headers=headers)
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"
