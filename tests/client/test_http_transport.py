"""Retry policy, timeouts and error mapping of the HTTP transport, against a scripted server."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import pytest

from dq.client import (
    AsyncClient,
    Client,
    ClientError,
    ItemNotFound,
    QueueNotFound,
    ServerError,
    StaleReceipt,
    TransportError,
    Unavailable,
    UnsupportedAddress,
    _connection,
    _http,
)
from tests.client.scripted import DROP, HANG, Answer, scripted

pytestmark = pytest.mark.integration  # scripted HTTP servers on 127.0.0.1

QUEUE_DOC = {
    "name": "q",
    "config": {"default_lease_ms": 1000, "max_deliveries": None, "dead_letter_queue": None},
    "stats": {"pending": 1, "due": 1, "delayed": 0, "leased": 0, "segments": 0,
              "bytes_on_disk": 10, "oldest_due_age_ms": 5, "next_id": 2},
}  # fmt: skip


@pytest.fixture
def refused_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first connect fails as if nothing listened; returns the list of refusals."""
    refusals: list[int] = []
    real = _connection.open_socket

    def flaky(address: Any, timeout: float) -> socket.socket:
        if not refusals:
            refusals.append(1)
            raise ConnectionRefusedError("refused")
        return real(address, timeout)

    monkeypatch.setattr(_connection, "open_socket", flaky)
    return refusals


def test_idempotent_reads_retry_on_503_and_connect_errors(refused_once: list[int]) -> None:
    busy = Answer(503, {"error": "unavailable", "message": "busy"})
    with scripted(busy, Answer(200, QUEUE_DOC)) as server, Client(server.url) as dq:
        assert dq.queue("q").stats.pending == 1
    assert len(refused_once) + len(server.seen) == 3


def test_enqueue_is_not_resent_after_a_lost_response() -> None:
    with scripted(DROP) as server, Client(server.url) as dq, pytest.raises(TransportError):
        dq.enqueue("q", b"x")
    assert len(server.seen) == 1
    busy = Answer(503, {"error": "unavailable", "message": "x"})
    with scripted(busy) as server, Client(server.url) as dq, pytest.raises(Unavailable):
        dq.enqueue("q", b"x")
    assert len(server.seen) == 1


def test_enqueue_is_retried_when_the_connection_never_opened(refused_once: list[int]) -> None:
    done = Answer(200, {"items": [{"id": 7, "deadline": 1}]})
    with scripted(done) as server, Client(server.url) as dq:
        assert dq.enqueue("q", "x", delay_ms=5) == 7
    body = json.loads(server.seen[-1][2])
    assert body == {"items": [{"value": "x", "encoding": "utf-8", "delay_ms": 5}]}
    assert refused_once == [1]


def test_a_timed_out_enqueue_is_not_resent() -> None:
    t0 = time.monotonic()
    with (
        scripted(HANG) as server,
        Client(server.url, timeout=0.3) as dq,
        pytest.raises(TransportError, match=r"no answer within 0\.3 s"),
    ):
        dq.enqueue("q", b"x")
    assert len(server.seen) == 1
    assert time.monotonic() - t0 < 5  # the client's timeout, not the server giving up


def test_server_codes_map_to_error_classes() -> None:
    missing = Answer(404, {"error": "queue_not_found", "message": "no"})
    with scripted(missing) as server, Client(server.url) as dq, pytest.raises(QueueNotFound) as err:
        dq.queue("q")
    assert err.value.status == 404 and err.value.queue == "q"
    results = {"results": [{"id": 3, "ok": False, "error": "stale_receipt", "message": "over"}]}
    with (
        scripted(Answer(200, results)) as server,
        Client(server.url) as dq,
        pytest.raises(StaleReceipt) as stale,
    ):
        dq.release("q", 3, "r")
    assert stale.value.status == 409 and stale.value.id == 3
    results["results"][0]["error"] = "item_not_found"
    with (
        scripted(Answer(200, results)) as server,
        Client(server.url) as dq,
        pytest.raises(ItemNotFound),
    ):
        dq.release("q", 3, "r")


def test_a_redirect_is_an_error_not_a_success() -> None:
    """A proxy redirecting http:// to https:// answers 301 with no body: a delete or a
    purge that was never carried out must not look done."""
    with scripted(Answer(301)) as server, Client(server.url, retries=0) as dq:
        with pytest.raises(ServerError) as err:
            dq.delete_queue("q")
        assert err.value.status == 301 and "redirected" in err.value.message
        with pytest.raises(ServerError):
            dq.purge("q")


def test_a_value_that_is_neither_bytes_nor_text_is_refused() -> None:
    """``bytes(123)`` is 123 zero bytes: an id passed as the value must not become them."""
    ok = Answer(200, {"items": [{"id": 1, "deadline": 1, "duplicate": False}]})
    with scripted(ok) as server, Client(server.url) as dq:
        for value in (123, True, None, 1.5):
            with pytest.raises(TypeError, match="bytes or str"):
                dq.enqueue("q", value)  # type: ignore[arg-type]
            with pytest.raises(TypeError, match="bytes or str"):
                dq.enqueue_many("q", [b"fine", value])  # type: ignore[list-item]
        assert dq.enqueue("q", bytearray(b"ok")) == 1
    assert len(server.seen) == 1

    async def run() -> None:
        async with AsyncClient(server.url) as adq:
            with pytest.raises(TypeError, match="bytes or str"):
                await adq.enqueue("q", 123)  # type: ignore[arg-type]

    with scripted(ok) as server:
        asyncio.run(run())
    assert server.seen == []


def test_binary_values_travel_as_base64() -> None:
    done = Answer(200, {"items": [{"id": 1, "deadline": 1}]})
    with scripted(done) as server, Client(server.url) as dq:
        dq.enqueue("q", b"\xff\xfe")
    assert json.loads(server.seen[0][2])["items"][0] == {"value": "//4=", "encoding": "base64"}


def test_keep_alive_and_a_connection_the_server_closed_while_idle() -> None:
    done = Answer(200, {"items": [{"id": 1, "deadline": 1}]})
    with scripted(done, done, Answer(200, {"items": [{"id": 2, "deadline": 1}]}, close_after=True),
                  done) as server, Client(server.url) as dq:  # fmt: skip
        assert [dq.enqueue("q", b"x") for _ in range(3)] == [1, 1, 2]
        assert server.connections == 1  # one connection carried all three
        # the server closed it after the third answer without saying so: an enqueue
        # (never resent) still goes out, on a new connection
        server.wait_closed(1)
        assert dq.enqueue("q", b"x") == 1
    assert (len(server.seen), server.connections) == (4, 2)


def test_chunked_answers() -> None:
    with scripted(Answer(200, QUEUE_DOC, chunked=True)) as server, Client(server.url) as dq:
        assert dq.queue("q").config.default_lease_ms == 1000
        assert dq.queue("q").stats.next_id == 2


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
    async def run(url: str) -> None:
        async with AsyncClient(url) as dq:
            with pytest.raises(StaleReceipt):
                await dq.extend("q", 1, "r", 1000)

    with scripted(Answer(409, {"error": "stale_receipt", "message": "over"})) as server:
        asyncio.run(run(server.url))


def test_async_lost_and_timed_out_enqueues_are_not_resent() -> None:
    async def run(url: str) -> None:
        async with AsyncClient(url, timeout=0.3) as dq:
            with pytest.raises(TransportError):
                await dq.enqueue("q", b"x")

    for step in (DROP, HANG):
        with scripted(step) as server:
            asyncio.run(run(server.url))
        assert len(server.seen) == 1


def test_async_timeout_after_a_longer_one_on_the_same_connection() -> None:
    """A long-poll's long timeout armed the connection's timer first; the next request's
    shorter timeout still ends it on time (the timer is armed again, earlier)."""

    async def run(url: str) -> float:
        async with AsyncClient(url, timeout=0.3) as dq:
            got = await dq.dequeue("q", wait_ms=5000)  # timeout 5.3 s, answered at once
            assert list(got) == []
            t0 = time.monotonic()
            with pytest.raises(TransportError):
                await dq.enqueue("q", b"x")  # never answered
            return time.monotonic() - t0

    with scripted(Answer(200, {"items": []}), HANG) as server:
        waited = asyncio.run(run(server.url))
    assert waited < 2.0
    assert server.connections == 1


def test_timeout_after_a_longer_one_on_the_same_connection() -> None:
    """The connection's kernel timeout follows each request's own (a long-poll's long
    one, then a short one)."""
    with (
        scripted(Answer(200, {"items": []}), HANG) as server,
        Client(server.url, timeout=0.3) as dq,
    ):
        assert list(dq.dequeue("q", wait_ms=5000)) == []  # timeout 5.3 s, answered at once
        t0 = time.monotonic()
        with pytest.raises(TransportError, match=r"no answer within 0\.3 s"):
            dq.enqueue("q", b"x")
        assert time.monotonic() - t0 < 2.0
    assert server.connections == 1


def test_one_item_shortcuts_send_and_raise_as_the_general_calls() -> None:
    """``enqueue`` and ``release`` of one item skip the value objects, not the rules: the
    same bodies for every kind of value, the same errors, keyed enqueues still retried."""
    done = Answer(200, {"items": [{"id": 4, "deadline": 1}]})
    with scripted(done) as server, Client(server.url) as dq:
        assert dq.enqueue("q", "é", deadline=5, key="k") == 4
        assert dq.enqueue("q", bytearray(b"ab")) == 4
        assert dq.enqueue("q", memoryview(b"\xff")) == 4
        assert dq.enqueue("q", b"x", delay_ms=True) == 4  # type: ignore[arg-type]
        with pytest.raises(UnicodeEncodeError):
            dq.enqueue("q", "\ud800")
    assert [json.loads(body)["items"] for _, _, body in server.seen] == [
        [{"value": "é", "encoding": "utf-8", "deadline": 5, "key": "k"}],
        [{"value": "ab", "encoding": "utf-8"}],
        [{"value": "/w==", "encoding": "base64"}],
        [{"value": "x", "encoding": "utf-8", "delay_ms": True}],
    ]
    lost_then_done = [Answer(503, {"error": "unavailable", "message": "x"}), done]
    with scripted(*lost_then_done) as server, Client(server.url) as dq:
        assert dq.enqueue("q", b"x", key="k") == 4  # keyed: idempotent, so retried
    assert len(server.seen) == 2
    stale = {"results": [{"id": 3, "ok": False, "error": "stale_receipt", "message": "over"}]}

    async def main() -> None:
        with scripted(done) as server:
            async with AsyncClient(server.url) as dq:
                assert await dq.enqueue("q", "é", delay_ms=2) == 4
                assert await dq.enqueue("q", memoryview(b"\xff")) == 4
            assert [json.loads(body)["items"] for _, _, body in server.seen] == [
                [{"value": "é", "encoding": "utf-8", "delay_ms": 2}],
                [{"value": "/w==", "encoding": "base64"}],
            ]
        with scripted(Answer(200, stale)) as server:
            async with AsyncClient(server.url) as dq:
                with pytest.raises(StaleReceipt) as err:
                    await dq.release("q", 3, "r")
                assert err.value.id == 3
                ok = {"results": [{"id": 3, "ok": True}]}
                server.script[:] = [Answer(200, ok)]
                assert await dq.release("q", 3, "r") is None
            assert json.loads(server.seen[0][2]) == {"items": [{"id": 3, "receipt": "r"}]}

    asyncio.run(asyncio.wait_for(main(), 30))


def test_async_requests_beyond_max_connections_wait_their_turn() -> None:
    """``max_connections`` bounds the requests in flight; a request cancelled while it
    waits, or just as a slot is handed to it, leaves no slot taken."""

    async def slots() -> None:
        limit = _http._Slots(1)
        assert limit.take() is None  # the one slot
        first, second, third = limit.take(), limit.take(), limit.take()
        assert first is not None and second is not None and third is not None

        async def holder(waiter: asyncio.Future[None]) -> None:
            try:
                await waiter
            except asyncio.CancelledError:
                if not waiter.cancelled():
                    limit.give()
                raise

        tasks = [asyncio.ensure_future(holder(w)) for w in (first, second)]
        await asyncio.sleep(0)
        tasks[0].cancel()  # cancelled while waiting: skipped when a slot comes back
        await asyncio.sleep(0)
        limit.give()  # handed to `second`, whose task is cancelled before it resumes
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert third.done()  # `second` passed its slot on
        limit.give()
        assert limit.take() is None and limit.take() is not None

    asyncio.run(asyncio.wait_for(slots(), 10))

    async def many(url: str) -> list[int]:
        async with AsyncClient(url, max_connections=2) as dq:
            return await asyncio.gather(*(dq.enqueue("q", b"x") for _ in range(6)))

    done = Answer(200, {"items": [{"id": 5, "deadline": 1}]})
    with scripted(done) as server:
        assert asyncio.run(asyncio.wait_for(many(server.url), 30)) == [5] * 6
    assert len(server.seen) == 6 and server.connections <= 2
