"""Items addressed by key over HTTP against a live ``dq serve``, as curl would use them: a
payment timeout cancelled by key, a debounced digest that is sent once, a rescheduled
reminder, a leased item that answers 409, and all of it through a SIGKILL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.server.live import LiveServer, call, live_server, ok

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def enqueue(server: LiveServer, queue: str, **item: Any) -> dict[str, Any]:
    done: dict[str, Any] = ok(
        call(server, "POST", f"/v1/queues/{queue}/items", json={"items": [item]})
    )["items"][0]
    return done


def take(server: LiveServer, queue: str, wait_ms: int = 0) -> list[dict[str, Any]]:
    body = {"count": 10, "wait_ms": wait_ms, "lease_ms": 30_000}
    items: list[dict[str, Any]] = ok(
        call(server, "POST", f"/v1/queues/{queue}/dequeue", json=body)
    )["items"]
    return items


def test_a_payment_timeout_cancelled_by_key(server: LiveServer, queue: str) -> None:
    ok(call(server, "PUT", f"/v1/queues/{queue}", json={"dedup_window_ms": 3_600_000}))
    t7 = enqueue(server, queue, value="expire order 7", delay_ms=1500, key="order-7")
    enqueue(server, queue, value="expire order 8", delay_ms=1500, key="order-8")
    peek = ok(call(server, "GET", f"/v1/queues/{queue}/keys/order-7"))
    assert (peek["id"], peek["state"], peek["value"], peek["key"]) == (
        t7["id"],
        "delayed",
        "expire order 7",
        "order-7",
    )
    # order 7 is paid before its timeout: cancel the timeout by its key
    assert ok(call(server, "DELETE", f"/v1/queues/{queue}/keys/order-7")) == {
        "cancelled": t7["id"],
        "key": "order-7",
    }
    r = call(server, "DELETE", f"/v1/queues/{queue}/keys/order-7")
    assert r.status_code == 404 and r.json()["error"] == "key_not_found"
    fired = []
    give_up = time.monotonic() + 10
    while time.monotonic() < give_up and not fired:
        fired = take(server, queue, wait_ms=1000)
    assert [i["value"] for i in fired] == ["expire order 8"]
    assert take(server, queue, wait_ms=500) == []  # order 7's never fires


def test_a_debounced_digest_is_sent_once_after_the_last_change(
    server: LiveServer, queue: str
) -> None:
    """ "Send the digest 1 s after the last change" (5 minutes in real life): each change
    replaces the pending digest; one digest goes out, 1 s after the last change."""
    ids = set()
    for n in range(4):
        # the server counts the delay from when it takes the change: after this clock
        # reading, however late its answer comes back on a loaded machine
        last = time.monotonic()
        done = enqueue(
            server, queue, value=f"digest after change {n}", delay_ms=1000, key="digest:u1",
            on_duplicate="replace",
        )  # fmt: skip
        ids.add(done["id"])
        assert done.get("replaced", False) == (n > 0)
        time.sleep(0.3)
    assert len(ids) == 1
    sent: list[dict[str, Any]] = []
    while time.monotonic() - last < 5 and not sent:
        sent = take(server, queue, wait_ms=500)
    # not before 1 s after the last change (less the deadline's rounding to a ms)
    assert time.monotonic() - last >= 0.998
    assert [i["value"] for i in sent] == ["digest after change 3"]
    time.sleep(1.2)
    assert take(server, queue) == []  # sent once


def test_reschedule_and_replace_by_key_and_the_409_of_a_leased_item(
    server: LiveServer, queue: str
) -> None:
    done = enqueue(server, queue, value="remind", delay_ms=600_000, key="user/42/remind")
    # a key may hold '/': as is, or escaped
    moved = ok(
        call(server, "PATCH", f"/v1/queues/{queue}/keys/user/42/remind", json={"delay_ms": 0})
    )
    assert moved["id"] == done["id"] and moved["deadline"] < done["deadline"]
    moved = ok(
        call(
            server,
            "PATCH",
            f"/v1/queues/{queue}/keys/user%2F42%2Fremind",
            json={"value": "remind!"},
        )
    )
    [item] = take(server, queue, wait_ms=2000)
    assert (item["id"], item["value"]) == (done["id"], "remind!")
    for method, body in (("PATCH", {"delay_ms": 5}), ("DELETE", None)):
        r = call(server, method, f"/v1/queues/{queue}/keys/user/42/remind", json=body)
        assert r.status_code == 409 and r.json()["error"] == "item_leased", r.text
    release = {"items": [{"id": item["id"], "receipt": item["receipt"]}]}
    assert ok(call(server, "POST", f"/v1/queues/{queue}/release", json=release))["results"][0]["ok"]
    gone = ok(call(server, "GET", f"/v1/queues/{queue}/keys/user/42/remind"))
    assert gone["state"] == "gone"
    r = call(server, "PATCH", f"/v1/queues/{queue}/keys/user/42/remind", json={})
    assert r.status_code == 400 and "nothing to change" in r.json()["message"]
    r = call(server, "PATCH", f"/v1/queues/{queue}/keys/user/42/remind", json={"delay_ms": 1})
    assert r.status_code == 404 and r.json()["error"] == "item_not_found"
    r = call(
        server, "POST", f"/v1/queues/{queue}/items",
        json={"items": [{"value": "x", "key": "k", "on_duplicate": "merge"}]},
    )  # fmt: skip
    assert r.status_code == 422


def test_a_peek_by_key_takes_values_and_encoding_as_a_peek_by_id(
    server: LiveServer, queue: str
) -> None:
    done = enqueue(server, queue, value="text", delay_ms=600_000, key="k")
    by_id = f"/v1/queues/{queue}/items/{done['id']}"
    by_key = f"/v1/queues/{queue}/keys/k"
    for params, value in (
        ({}, ("text", "utf-8")),
        ({"encoding": "base64"}, ("dGV4dA==", "base64")),
        ({"values": "false"}, None),
    ):
        item = ok(call(server, "GET", by_key, params=params))
        assert item == {**ok(call(server, "GET", by_id, params=params)), "key": "k"}
        shown = (item["value"], item["encoding"]) if "value" in item else None
        assert shown == value, params
    for params in ({"encoding": "utf-16"}, {"values": "maybe"}):
        for path in (by_id, by_key):
            r = call(server, "GET", path, params=params)
            assert r.status_code == 422 and r.json()["error"] == "validation_error", r.text


def test_cancels_and_replaces_by_key_survive_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    q = "reminders"
    with live_server(data, fsync="always") as server:
        enqueue(server, q, value="a", delay_ms=60_000, key="a")
        enqueue(server, q, value="b", delay_ms=60_000, key="b")
        ok(call(server, "DELETE", f"/v1/queues/{q}/keys/a"))
        enqueue(server, q, value="b2", delay_ms=0, key="b", on_duplicate="replace")
        server.kill()
    with live_server(data, fsync="always") as server:
        r = call(server, "GET", f"/v1/queues/{q}/keys/a")
        assert r.status_code == 404 and r.json()["error"] == "key_not_found"
        assert ok(call(server, "GET", f"/v1/queues/{q}/keys/b"))["value"] == "b2"
        [item] = take(server, q, wait_ms=2000)
        assert item["value"] == "b2"
        assert take(server, q) == []  # one item for b; a is gone
