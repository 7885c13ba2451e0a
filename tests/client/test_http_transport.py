"""Retry policy and error mapping of the HTTP transport, with a mock httpx transport."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from dq.client import (
    AsyncClient,
    Client,
    ClientError,
    ItemNotFound,
    QueueNotFound,
    StaleReceipt,
    TransportError,
    Unavailable,
    UnsupportedAddress,
)
from dq.client._http import AsyncHttpTransport, HttpTransport


def _client(handler: httpx.MockTransport, retries: int = 3) -> Client:
    return Client(
        "http://dq.test",
        transport=HttpTransport("http://dq.test", http_transport=handler, retries=retries),
    )


def _counting(
    responses: list[httpx.Response | Exception],
) -> tuple[httpx.MockTransport, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        r = responses[min(len(seen), len(responses)) - 1]
        if isinstance(r, Exception):
            raise r
        return r

    return httpx.MockTransport(handle), seen


QUEUE_DOC = {
    "name": "q",
    "config": {"default_lease_ms": 1000, "max_deliveries": None, "dead_letter_queue": None},
    "stats": {"pending": 1, "due": 1, "delayed": 0, "leased": 0, "segments": 0,
              "bytes_on_disk": 10, "oldest_due_age_ms": 5, "next_id": 2},
}  # fmt: skip


def test_idempotent_reads_retry_on_503_and_connect_errors() -> None:
    mock, seen = _counting([
        httpx.ConnectError("refused"),
        httpx.Response(503, json={"error": "unavailable", "message": "busy"}),
        httpx.Response(200, json=QUEUE_DOC),
    ])  # fmt: skip
    with _client(mock) as dq:
        assert dq.queue("q").stats.pending == 1
    assert len(seen) == 3


def test_enqueue_is_not_resent_after_a_lost_response() -> None:
    mock, seen = _counting([httpx.ReadTimeout("lost")])
    with _client(mock) as dq, pytest.raises(TransportError):
        dq.enqueue("q", b"x")
    assert len(seen) == 1
    mock, seen = _counting([httpx.Response(503, json={"error": "unavailable", "message": "x"})])
    with _client(mock) as dq, pytest.raises(Unavailable):
        dq.enqueue("q", b"x")
    assert len(seen) == 1


def test_enqueue_is_retried_when_the_connection_never_opened() -> None:
    mock, seen = _counting([
        httpx.ConnectError("refused"),
        httpx.Response(200, json={"items": [{"id": 7, "deadline": 1}]}),
    ])  # fmt: skip
    with _client(mock) as dq:
        assert dq.enqueue("q", "x", delay_ms=5) == 7
    body = json.loads(seen[-1].content)
    assert body == {"items": [{"value": "x", "encoding": "utf-8", "delay_ms": 5}]}


def test_server_codes_map_to_error_classes() -> None:
    mock, _ = _counting([httpx.Response(404, json={"error": "queue_not_found", "message": "no"})])
    with _client(mock) as dq, pytest.raises(QueueNotFound) as err:
        dq.queue("q")
    assert err.value.status == 404 and err.value.queue == "q"
    results = {"results": [{"id": 3, "ok": False, "error": "stale_receipt", "message": "over"}]}
    mock, _ = _counting([httpx.Response(200, json=results)])
    with _client(mock) as dq, pytest.raises(StaleReceipt) as stale:
        dq.release("q", 3, "r")
    assert stale.value.status == 409 and stale.value.id == 3
    results["results"][0]["error"] = "item_not_found"
    mock, _ = _counting([httpx.Response(200, json=results)])
    with _client(mock) as dq, pytest.raises(ItemNotFound):
        dq.release("q", 3, "r")


def test_binary_values_travel_as_base64() -> None:
    mock, seen = _counting([httpx.Response(200, json={"items": [{"id": 1, "deadline": 1}]})])
    with _client(mock) as dq:
        dq.enqueue("q", b"\xff\xfe")
    assert json.loads(seen[0].content)["items"][0] == {"value": "//4=", "encoding": "base64"}


def test_unknown_scheme_and_missing_shm_transport() -> None:
    with pytest.raises(UnsupportedAddress):
        Client("ftp://x")
    try:
        import dq.client.shm_transport  # noqa: F401
    except ImportError:
        with pytest.raises(UnsupportedAddress, match="shared-memory"):
            Client("shm:///tmp/dq-data")


def test_connection_refused_is_a_transport_error() -> None:
    with Client("http://127.0.0.1:9", retries=1, timeout=2) as dq, pytest.raises(ClientError):
        dq.health()


def test_async_transport_maps_the_same_way() -> None:
    async def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "stale_receipt", "message": "over"})

    async def run() -> None:
        transport = AsyncHttpTransport("http://dq.test", http_transport=httpx.MockTransport(handle))
        async with AsyncClient("http://dq.test", transport=transport) as dq:
            with pytest.raises(StaleReceipt):
                await dq.extend("q", 1, "r", 1000)

    asyncio.run(run())
