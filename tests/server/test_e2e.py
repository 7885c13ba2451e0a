"""End to end through the client against a real ``dq serve`` on 127.0.0.1: every route."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from dq.client import (
    Client,
    Extend,
    NewItem,
    QueueConfig,
    QueueNotFound,
    Release,
    Requeue,
    StaleReceipt,
    ValidationError,
)
from tests.server.live import LiveServer


def test_enqueue_dequeue_release(dq: Client, queue: str) -> None:
    first = dq.enqueue(queue, b"hello")
    done = dq.enqueue_many(queue, [b"\xff\x00binary", "text", NewItem(b"later", delay_ms=60_000)])
    assert [e.id for e in done] == [first + 1, first + 2, first + 3]
    items = dq.dequeue(queue, count=10)
    assert [i.value for i in items] == [b"hello", b"\xff\x00binary", b"text"]
    assert all(i.stats.dequeue_count == 1 and i.lease_expires > i.deadline for i in items)
    outcomes = dq.release_many(queue, items)
    assert [o.ok for o in outcomes] == [True, True, True]
    assert dq.dequeue(queue, count=10) == []  # the delayed one is not due
    info = dq.queue(queue)
    assert (info.stats.pending, info.stats.delayed, info.stats.leased) == (1, 1, 0)


def test_items_come_in_deadline_order(dq: Client, queue: str) -> None:
    now = int(time.time() * 1000)
    dq.enqueue_many(queue, [NewItem(b"b", deadline=now - 1000), NewItem(b"a", deadline=now - 2000)])
    dq.enqueue(queue, b"c")
    assert [i.value for i in dq.dequeue(queue, count=3)] == [b"a", b"b", b"c"]


def test_stale_receipt_is_409_and_changes_nothing(
    dq: Client, queue: str, server: LiveServer
) -> None:
    dq.enqueue(queue, b"x")
    (item,) = dq.dequeue(queue, lease_ms=60_000)
    dq.release(queue, item.id, item.receipt)
    with pytest.raises(StaleReceipt) as err:
        dq.release(queue, item.id, item.receipt)
    assert err.value.status == 409 and err.value.code == "stale_receipt"
    r = httpx.post(
        f"{server.url}/v1/queues/{queue}/items/{item.id}/requeue", json={"receipt": item.receipt}
    )
    assert r.status_code == 409 and r.json()["error"] == "stale_receipt"
    (outcome,) = dq.release_many(queue, [item])
    assert not outcome.ok and outcome.error == "stale_receipt"
    assert dq.queue(queue).stats.pending == 0


def test_requeue_and_extend(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"job")
    (item,) = dq.dequeue(queue, lease_ms=60_000)
    ext = dq.extend(queue, item.id, item.receipt, lease_ms=120_000)
    assert ext.receipt and ext.lease_expires is not None and ext.lease_expires > item.lease_expires
    deadline = dq.requeue(queue, item.id, ext.receipt, delay_ms=0)
    assert deadline > 0
    (again,) = dq.dequeue(queue)
    assert again.id == item.id and again.stats.dequeue_count == 2 and again.stats.requeue_time > 0
    (o,) = dq.extend_many(queue, [Extend(again.id, again.receipt, 5_000)])
    assert o.ok
    (r,) = dq.requeue_many(queue, [Requeue(again.id, o.receipt or "", delay_ms=60_000)])
    assert r.ok and r.deadline is not None and r.deadline >= again.deadline + 59_000
    assert dq.dequeue(queue) == []


def test_lease_expiry_redelivers(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"v")
    (first,) = dq.dequeue(queue, lease_ms=100)
    (second,) = dq.dequeue(queue, wait_ms=5_000)  # comes back when the lease runs out
    assert second.id == first.id and second.receipt != first.receipt
    assert second.stats.dequeue_count == 2
    with pytest.raises(StaleReceipt):
        dq.release(queue, first.id, first.receipt)
    dq.release(queue, second.id, second.receipt)


def test_lease_expires_without_any_dequeue(dq: Client, queue: str) -> None:
    dq.enqueue(queue, b"v")
    dq.dequeue(queue, lease_ms=100)
    give_up = time.monotonic() + 10
    while dq.queue(queue).stats.leased and time.monotonic() < give_up:
        time.sleep(0.05)
    stats = dq.queue(queue).stats
    assert (stats.leased, stats.due) == (0, 1)  # the expiry task gave it back


def test_long_poll_wakes_on_enqueue(dq: Client, server: LiveServer, queue: str) -> None:
    dq.put_queue(queue)
    timer = threading.Timer(0.3, lambda: httpx.post(
        f"{server.url}/v1/queues/{queue}/items", json={"items": [{"value": "wake"}]}, timeout=10
    ))  # fmt: skip
    t0 = time.monotonic()
    timer.start()
    try:
        items = dq.dequeue(queue, wait_ms=5_000)
    finally:
        timer.join(10)
    assert [i.value for i in items] == [b"wake"]
    assert time.monotonic() - t0 < 4.0  # woke on the enqueue, not at the end of the wait


def test_long_poll_wakes_when_item_becomes_due(dq: Client, queue: str) -> None:
    t0 = time.monotonic()
    dq.enqueue(queue, b"soon", delay_ms=300)
    items = dq.dequeue(queue, wait_ms=5_000)
    assert [i.value for i in items] == [b"soon"]
    assert time.time() * 1000 >= items[0].deadline  # not before it was due
    assert time.monotonic() - t0 < 4.0  # woke when due, not at the end of the wait


def test_long_poll_times_out_empty(dq: Client, queue: str) -> None:
    dq.put_queue(queue)
    t0 = time.monotonic()
    assert dq.dequeue(queue, wait_ms=200) == []
    assert time.monotonic() - t0 >= 0.19


def test_dead_letters(dq: Client, queue: str) -> None:
    dlq = queue + ".dead"
    dq.put_queue(queue, QueueConfig(default_lease_ms=50, max_deliveries=2, dead_letter_queue=dlq))
    dq.enqueue(queue, b"poison")
    for attempt in (1, 2):
        (item,) = dq.dequeue(queue, wait_ms=5_000)
        assert item.stats.dequeue_count == attempt  # and its lease runs out
    assert dq.dequeue(queue, wait_ms=500) == []  # a third delivery moves it instead
    (dead,) = dq.dequeue(dlq, wait_ms=5_000)
    assert dead.value == b"poison"
    assert dq.queue(queue).stats.pending == 0


def test_queue_admin(dq: Client, queue: str) -> None:
    info = dq.put_queue(queue, QueueConfig(default_lease_ms=1234))
    assert info.config == QueueConfig(default_lease_ms=1234) and info.stats.pending == 0
    assert queue in [q.name for q in dq.queues()]
    dq.enqueue(queue, b"x")
    before = int(time.time() * 1000)
    (item,) = dq.dequeue(queue)
    # the lease runs from when the server took the dequeue: between the two readings
    assert before + 1234 <= item.lease_expires <= int(time.time() * 1000) + 1234
    dq.delete_queue(queue)
    with pytest.raises(QueueNotFound):
        dq.queue(queue)
    assert dq.dequeue(queue) == []  # a queue that does not exist has nothing due
    assert queue not in [q.name for q in dq.queues()]


def test_limits_and_validation(dq: Client, server: LiveServer, queue: str) -> None:
    # the server refuses a batch over its limit whole (the client splits long lists, so
    # the refusal is asked for directly)
    r = httpx.post(f"{server.url}/v1/queues/{queue}/items", json={"items": [{"value": "x"}] * 1001})
    assert r.status_code == 413 and r.json()["error"] == "batch_too_large", r.text
    assert queue not in [q.name for q in dq.queues()]  # refused before anything is written
    with pytest.raises(ValidationError):
        dq.enqueue(queue, b"x", deadline=-1)
    r = httpx.post(
        f"{server.url}/v1/queues/{queue}/items", json={"items": [{"value": "x"}]} | {"z": 1}
    )
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    r = httpx.post(
        f"{server.url}/v1/queues/{queue}/items",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_json"
    for unreadable in (b'{"items": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", b"1" * 5000):
        r = httpx.post(
            f"{server.url}/v1/queues/{queue}/items",
            content=unreadable,
            headers={"content-type": "application/json"},
        )
        assert r.status_code == 400 and r.json()["error"] == "invalid_json", r.text
    r = httpx.post(
        f"{server.url}/v1/queues/{queue}/items",
        json={"items": [{"value": "@@", "encoding": "base64"}]},
    )
    assert r.status_code == 422
    for bad in ("x" * 129, "sp ace", "a+b"):
        r = httpx.post(f"{server.url}/v1/queues/{bad}/dequeue", json={})
        assert r.status_code == 400 and r.json()["error"] == "invalid_queue_name", bad
    release = f"{server.url}/v1/queues/{queue}/release"
    r = httpx.post(release, json={"items": [{"id": 1, "receipt": "nonsense"}]})
    assert r.status_code == 404 and r.json()["error"] == "queue_not_found"
    dq.put_queue(queue)
    r = httpx.post(release, json={"items": [{"id": 1, "receipt": "nonsense"}]})
    assert r.status_code == 200 and r.json()["results"][0]["error"] == "invalid_receipt"


@pytest.mark.parametrize("bad", [{"lease_ms": 12 * 3600 * 1000 + 1}, {"count": 1001}])
def test_a_refused_dequeue_releases_nothing(
    dq: Client, server: LiveServer, queue: str, bad: dict[str, int]
) -> None:
    """A dequeue carrying releases that is refused (422, its own fields out of range)
    has released nothing: the worker may send its releases again and they apply."""
    dq.enqueue(queue, b"work")
    (item,) = dq.dequeue(queue)
    done = {"id": item.id, "receipt": item.receipt}
    url = f"{server.url}/v1/queues/{queue}"
    r = httpx.post(url + "/dequeue", json={"count": 1, **bad, "release": [done]})
    assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text
    r = httpx.post(url + "/release", json={"items": [done]})
    assert r.json()["results"] == [{"id": item.id, "ok": True}]


def test_health_metrics_and_docs(dq: Client, server: LiveServer, queue: str) -> None:
    dq.enqueue(queue, b"x")
    dq.release_many(queue, dq.dequeue(queue))
    assert dq.health()["status"] == "ok"
    text = httpx.get(server.url + "/metrics").text
    for name in (
        'dq_requests_total{operation="enqueue",outcome="ok"}',
        'dq_request_duration_seconds_bucket{le="0.001",operation="dequeue"}',
        "dq_delivery_lateness_seconds_count",
        f'dq_queue_pending{{queue="{queue}"}}',
        "dq_fsync_duration_seconds_count",
    ):
        assert name in text
    assert httpx.get(server.url + "/docs").status_code == 200
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    assert "/v1/queues/{queue}/dequeue" in paths


def test_values_round_trip_base64(dq: Client, server: LiveServer, queue: str) -> None:
    dq.enqueue(queue, "héllo")
    r = httpx.post(f"{server.url}/v1/queues/{queue}/dequeue", json={"encoding": "base64"})
    (doc,) = r.json()["items"]
    assert doc["encoding"] == "base64" and doc["value"] == "aMOpbGxv"
    dq.release_many(queue, [Release(doc["id"], doc["receipt"])])


def test_a_disconnected_long_poll_takes_nothing(dq: Client, server: LiveServer, queue: str) -> None:
    dq.put_queue(queue)
    body = b'{"wait_ms": 5000}'
    request = (
        f"POST /v1/queues/{queue}/dequeue HTTP/1.1\r\nHost: dq\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(request)
        time.sleep(0.3)  # the long-poll is parked on the server
    time.sleep(0.3)  # the client is gone
    dq.enqueue(queue, b"for the living")
    time.sleep(0.3)  # a live long-poll would have leased it by now
    (item,) = dq.dequeue(queue)  # the dead request did not
    assert item.value == b"for the living" and item.stats.dequeue_count == 1


def test_enqueue_fast_path_and_framework_path_agree(server: LiveServer, queue: str) -> None:
    """A plain JSON enqueue takes the fast path; a chunked body goes through the FastAPI
    route. Both answer the same shape and both write."""
    url = f"{server.url}/v1/queues/{queue}/items"
    body = b'{"items": [{"value": "a"}, {"value": "Yg==", "encoding": "base64"}]}'

    def chunked() -> Iterator[bytes]:
        yield body[:10]
        yield body[10:]

    answers = [
        httpx.post(url, content=body, headers={"content-type": "application/json"}),
        httpx.post(url, content=chunked(), headers={"content-type": "application/json"}),
    ]
    for r in answers:
        assert r.status_code == 200, r.text
        assert [sorted(i) for i in r.json()["items"]] == [["deadline", "duplicate", "id"]] * 2
    with Client(server.url) as dq:
        got = dq.dequeue(queue, count=10)
    assert [i.value for i in got] == [b"a", b"b"] * 2
    release = f"{server.url}/v1/queues/{queue}/release"
    rel = json.dumps({"items": [{"id": i.id, "receipt": i.receipt} for i in got[:2]]}).encode()
    rel_chunked = json.dumps({"items": [{"id": i.id, "receipt": i.receipt} for i in got[1:]]})

    def chunks() -> Iterator[bytes]:
        yield rel_chunked.encode()

    fast = httpx.post(release, content=rel, headers={"content-type": "application/json"})
    slow = httpx.post(release, content=chunks(), headers={"content-type": "application/json"})
    assert fast.json() == {
        "results": [{"id": got[0].id, "ok": True}, {"id": got[1].id, "ok": True}]
    }
    assert slow.json()["results"][0] == {
        "id": got[1].id,
        "ok": False,
        "error": "stale_receipt",
        "message": slow.json()["results"][0]["message"],
    }
    assert [r["ok"] for r in slow.json()["results"]] == [False, True, True]


def test_enqueue_errors_are_the_same_on_both_paths(dq: Client, server: LiveServer) -> None:
    r = httpx.post(f"{server.url}/v1/queues/sp%20ace/items", json={"items": [{"value": "x"}]})
    assert r.status_code == 400 and r.json()["error"] == "invalid_queue_name"
    big = "x" * ((1 << 20) + 1)
    r = httpx.post(f"{server.url}/v1/queues/big/items", json={"items": [{"value": big}]})
    assert r.status_code == 413 and r.json()["error"] == "value_too_large"
    r = httpx.post(
        f"{server.url}/v1/queues/q/items",
        json={"items": [{"value": "x", "deadline": 1, "delay_ms": 1}]},
    )
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
