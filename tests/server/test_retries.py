"""Retry policies and fail over HTTP against a live ``dq serve``, as curl would use them:
the next deadline follows the queue's policy, the error is on the next delivery, on peek,
on browse and in the dead letters, and it survives a SIGKILL and a redrive."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.live import LiveServer, call, live_server, ok

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dequeue(server: LiveServer, queue: str, **body: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = ok(
        call(server, "POST", f"/v1/queues/{queue}/dequeue", json=body)
    )["items"]
    return items


def fail(server: LiveServer, queue: str, item: dict[str, Any], error: str) -> dict[str, Any]:
    body = {"items": [{"id": item["id"], "receipt": item["receipt"], "error": error}]}
    result: dict[str, Any] = ok(call(server, "POST", f"/v1/queues/{queue}/fail", json=body))[
        "results"
    ][0]
    return result


def wait_for(server: LiveServer, queue: str, timeout: float = 10.0) -> dict[str, Any]:
    """The next delivery, long-polled (it waits out a retry delay)."""
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        got = dequeue(server, queue, count=1, wait_ms=2000, lease_ms=30_000)
        if got:
            return got[0]
    raise AssertionError(f"nothing delivered from {queue} within {timeout} s")


def test_a_queue_shows_its_policy_and_refuses_a_bad_one(server: LiveServer, queue: str) -> None:
    policy = {"initial_ms": 200, "multiplier": 2.0, "max_ms": 1000, "jitter": 0.0}
    info = ok(call(server, "PUT", f"/v1/queues/{queue}", json={"retry": policy}))
    assert info["config"]["retry"] == policy
    info = ok(call(server, "PUT", f"/v1/queues/{queue}", json={"retry": {"delays_ms": [5, 50]}}))
    assert info["config"]["retry"] == {"delays_ms": [5, 50]}
    assert ok(call(server, "GET", f"/v1/queues/{queue}"))["config"]["retry"] == {
        "delays_ms": [5, 50]
    }
    r = call(server, "PUT", f"/v1/queues/{queue}", json={"retry": {"initial_ms": 10, "jitter": 2}})
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error"
    assert "retry.jitter must be a number between 0 and 1" in r.json()["message"]
    # the refused config changed nothing
    assert ok(call(server, "GET", f"/v1/queues/{queue}"))["config"]["retry"] == {
        "delays_ms": [5, 50]
    }


def test_fail_waits_per_the_policy_and_the_next_delivery_says_why(
    server: LiveServer, queue: str
) -> None:
    ok(call(server, "PUT", f"/v1/queues/{queue}", json={"retry": {"delays_ms": [300, 900]}}))
    ok(call(server, "POST", f"/v1/queues/{queue}/items", json={"items": [{"value": "charge"}]}))
    first = wait_for(server, queue)
    assert "last_error" not in first  # it never failed
    t0 = int(time.time() * 1000)
    result = fail(server, queue, first, "TimeoutError: card network")
    t1 = int(time.time() * 1000)
    # 300 ms after the server took the fail, which it did between t0 and t1
    assert result["ok"] and t0 + 300 <= result["deadline"] <= t1 + 300
    assert dequeue(server, queue, count=1) == []  # not before its retry delay
    second = wait_for(server, queue)
    assert int(time.time() * 1000) >= result["deadline"]
    assert second["last_error"] == "TimeoutError: card network"
    assert second["stats"]["dequeue_count"] == 2
    result = fail(server, queue, second, "TimeoutError: again")
    assert result["deadline"] - second["last_error_at"] >= 900
    peek = ok(call(server, "GET", f"/v1/queues/{queue}/items/{first['id']}"))
    assert peek["last_error"] == "TimeoutError: again"
    assert [(r["error"], r["delivery"]) for r in peek["errors"]] == [
        ("TimeoutError: again", 2),
        ("TimeoutError: card network", 1),
    ]
    page = ok(call(server, "GET", f"/v1/queues/{queue}/items"))
    assert page["items"][0]["last_error"] == "TimeoutError: again"
    # a stale receipt fails nothing
    stale = fail(server, queue, second, "late")
    assert stale["error"] == "stale_receipt"


def test_an_error_over_4_kib_is_refused_whole(server: LiveServer, queue: str) -> None:
    ok(call(server, "POST", f"/v1/queues/{queue}/items", json={"items": [{"value": "a"}]}))
    item = wait_for(server, queue)
    r = call(
        server,
        "POST",
        f"/v1/queues/{queue}/fail",
        json={"items": [{"id": item["id"], "receipt": item["receipt"], "error": "x" * 4097}]},
    )
    assert r.status_code == 422, r.text
    assert "error must be at most 4096 bytes of UTF-8" in r.json()["message"]
    # nothing happened: the lease still holds, and a release takes it
    r = call(
        server,
        "POST",
        f"/v1/queues/{queue}/items/{item['id']}/release",
        json={"receipt": item["receipt"]},
    )
    assert r.status_code == 200, r.text


def test_one_item_fail_route_answers_409_for_a_stale_receipt(
    server: LiveServer, queue: str
) -> None:
    ok(call(server, "POST", f"/v1/queues/{queue}/items", json={"items": [{"value": "a"}]}))
    item = wait_for(server, queue)
    path = f"/v1/queues/{queue}/items/{item['id']}/fail"
    assert ok(call(server, "POST", path, json={"receipt": item["receipt"], "error": "no"}))["ok"]
    r = call(server, "POST", path, json={"receipt": item["receipt"], "error": "no"})
    assert r.status_code == 409 and r.json()["error"] == "stale_receipt"


def test_reasons_survive_sigkill_and_show_in_the_dead_letters_and_after_a_redrive(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    q = "payments"
    config = {"max_deliveries": 2, "retry": {"delays_ms": [100]}, "default_lease_ms": 60_000}
    with live_server(data, fsync="always") as server:
        ok(call(server, "PUT", f"/v1/queues/{q}", json=config))
        ok(call(server, "POST", f"/v1/queues/{q}/items", json={"items": [{"value": "refund 7"}]}))
        item = wait_for(server, q)
        assert fail(server, q, item, "KeyError: 'account'")["ok"]
        server.kill()  # SIGKILL: the fail was acknowledged, so it is on disk
    with live_server(data, fsync="always") as server:
        again = wait_for(server, q)
        assert again["last_error"] == "KeyError: 'account'"
        assert fail(server, q, again, "KeyError: 'account' (2)")["ok"]
        # out of deliveries: the next dequeue moves it to payments.dlq
        assert dequeue(server, q, count=1, wait_ms=500) == []
        dead = ok(call(server, "GET", "/v1/queues/payments.dlq/items", params={"values": "true"}))
        assert [i["value"] for i in dead["items"]] == ["refund 7"]
        assert dead["items"][0]["last_error"] == "KeyError: 'account' (2)"
        assert len(dead["items"][0]["errors"]) == 2
        server.kill()
    with live_server(data, fsync="always") as server:
        dead = ok(call(server, "GET", "/v1/queues/payments.dlq/items"))
        assert dead["items"][0]["last_error"] == "KeyError: 'account' (2)"
        assert ok(call(server, "POST", "/v1/queues/payments.dlq/redrive"))["moved"] == 1
        back = wait_for(server, q)
        assert back["stats"]["dequeue_count"] == 1  # its attempts start afresh
        assert back["last_error"] == "KeyError: 'account' (2)"
        peek = ok(call(server, "GET", f"/v1/queues/{q}/items/{back['id']}"))
        assert [r["error"] for r in peek["errors"]] == [
            "KeyError: 'account' (2)",
            "KeyError: 'account'",
        ]
