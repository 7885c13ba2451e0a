"""The operator routes over HTTP against a live ``dq serve``, as curl would use them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx

from tests.server.live import LiveServer, call, live_server


def enqueue(server: LiveServer, queue: str, *items: dict[str, Any]) -> list[dict[str, Any]]:
    r = call(server, "POST", f"/v1/queues/{queue}/items", json={"items": list(items)})
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["items"]
    return out


def test_pause_holds_long_polls_and_resume_wakes_them(server: LiveServer, queue: str) -> None:
    enqueue(server, queue, {"value": "a"})
    r = call(server, "POST", f"/v1/queues/{queue}/pause")
    assert r.status_code == 200 and r.json()["stats"]["paused"] is True
    assert r.json()["stats"]["paused_since"] > 0
    enqueue(server, queue, {"value": "b"})  # a paused queue accepts writes
    got: list[httpx.Response] = []

    def poll() -> None:
        got.append(
            call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 5, "wait_ms": 4000})
        )

    t = threading.Thread(target=poll)
    t0 = time.monotonic()
    t.start()
    time.sleep(0.5)
    assert not got  # waiting: nothing is handed out while paused
    r = call(server, "POST", f"/v1/queues/{queue}/resume")
    assert r.status_code == 200 and r.json()["stats"]["paused"] is False
    t.join(10)
    assert [i["value"] for i in got[0].json()["items"]] == ["a", "b"]
    assert time.monotonic() - t0 < 3.5  # woken by the resume, not by the end of the wait


def test_browse_pages_and_peek_by_id(server: LiveServer, queue: str) -> None:
    now = int(time.time() * 1000)
    ids = [e["id"] for e in enqueue(server, queue, *({"value": f"v{i}"} for i in range(5)))]
    later = enqueue(server, queue, {"value": "later", "deadline": now + 600_000})[0]["id"]
    r = call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1, "lease_ms": 60_000})
    leased = r.json()["items"][0]
    seen: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 2, "values": "true"}
        if after:
            params["after"] = after
        page = call(server, "GET", f"/v1/queues/{queue}/items", params=params).json()
        seen += page["items"]
        after = page["next"]
        if after is None:
            break
    assert [i["id"] for i in seen] == [*ids, later]
    assert [i["state"] for i in seen] == ["leased", "due", "due", "due", "due", "delayed"]
    assert seen[0]["lease_expires"] == leased["lease_expires"]
    assert seen[1]["value"] == "v1" and seen[1]["value_size"] == 2
    page = call(server, "GET", f"/v1/queues/{queue}/items", params={"state": "delayed"}).json()
    assert [i["id"] for i in page["items"]] == [later] and "value" not in page["items"][0]
    one = call(server, "GET", f"/v1/queues/{queue}/items/{ids[2]}").json()
    assert (one["state"], one["value"], one["stats"]["dequeue_count"]) == ("due", "v2", 0)
    receipt = {"id": leased["id"], "receipt": leased["receipt"]}
    r = call(server, "POST", f"/v1/queues/{queue}/release", json={"items": [receipt]})
    assert r.json()["results"][0]["ok"], r.text
    gone = call(server, "GET", f"/v1/queues/{queue}/items/{ids[0]}").json()
    assert gone["state"] == "gone" and gone["deadline"] is None
    r = call(server, "GET", f"/v1/queues/{queue}/items/999999")
    assert r.status_code == 404 and r.json()["error"] == "item_not_found"


def test_browse_bad_input_says_what_to_fix(server: LiveServer, queue: str) -> None:
    enqueue(server, queue, {"value": "a"}, {"value": "b"})
    enqueue(server, queue + "-other", {"value": "x"})
    page = call(server, "GET", f"/v1/queues/{queue}/items", params={"limit": 1}).json()
    r = call(server, "GET", f"/v1/queues/{queue}-other/items", params={"after": page["next"]})
    assert r.status_code == 400 and r.json()["error"] == "bad_cursor"
    assert queue in r.json()["message"]
    r = call(server, "GET", f"/v1/queues/{queue}/items", params={"state": "sleeping"})
    assert r.status_code == 422 and r.json()["details"][0]["loc"] == ["query", "state"]
    r = call(server, "GET", f"/v1/queues/{queue}/items", params={"limit": 5000})
    assert r.status_code == 422
    r = call(server, "GET", "/v1/queues/no-such-queue/items")
    assert r.status_code == 404 and r.json()["error"] == "queue_not_found"


def test_delete_one_and_purge(server: LiveServer, queue: str) -> None:
    ids = [e["id"] for e in enqueue(server, queue, *({"value": str(i)} for i in range(4)))]
    r = call(server, "DELETE", f"/v1/queues/{queue}/items/{ids[1]}")
    assert r.status_code == 200 and r.json() == {"deleted": ids[1]}
    r = call(server, "DELETE", f"/v1/queues/{queue}/items/{ids[1]}")
    assert r.status_code == 404 and r.json()["error"] == "item_not_found"
    leased = call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1}).json()
    r = call(server, "DELETE", f"/v1/queues/{queue}/items")
    assert r.status_code == 200 and r.json() == {"purged": 3}
    receipts = [{"id": i["id"], "receipt": i["receipt"]} for i in leased["items"]]
    r = call(server, "POST", f"/v1/queues/{queue}/release", json={"items": receipts})
    assert r.json()["results"][0]["error"] == "stale_receipt"
    stats = call(server, "GET", f"/v1/queues/{queue}").json()["stats"]
    assert (stats["pending"], stats["leased"]) == (0, 0)


def test_keyed_enqueue_answers_repeats(server: LiveServer, queue: str) -> None:
    first = enqueue(server, queue, {"value": "a", "key": "order-1"})
    again = enqueue(server, queue, {"value": "a", "key": "order-1"}, {"value": "b", "key": "o-2"})
    assert again[0] == {**first[0], "duplicate": True}
    assert again[1]["duplicate"] is False
    r = call(
        server,
        "POST",
        f"/v1/queues/{queue}/items",
        json={"items": [{"value": "c"}, {"value": "d", "key": "k" * 129}]},
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_key"
    assert "128" in r.json()["message"] and "index=1" in r.json()["message"]
    assert call(server, "GET", f"/v1/queues/{queue}").json()["stats"]["pending"] == 2


def test_dead_letters_are_counted_logged_and_redriven(server: LiveServer, queue: str) -> None:
    r = call(
        server, "PUT", f"/v1/queues/{queue}", json={"max_deliveries": 1, "default_lease_ms": 100}
    )
    assert r.json()["config"]["dead_letter_queue"] == f"{queue}.dlq"
    assert r.json()["config"]["dedup_window_ms"] == 300_000
    enqueue(server, queue, {"value": "poison"})
    call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1})
    time.sleep(0.3)
    r = call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1})
    assert r.json()["items"] == []
    deadline = time.monotonic() + 5
    while call(server, "GET", f"/v1/queues/{queue}").json()["stats"]["dead_lettered"] != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    dlq = f"{queue}.dlq"
    page = call(server, "GET", f"/v1/queues/{dlq}/items", params={"values": "true"}).json()
    assert page["items"][0]["dead_lettered_from"] == queue
    assert page["items"][0]["value"] == "poison"
    metrics = call(server, "GET", "/metrics").text
    assert f'dq_queue_dead_lettered_total{{queue="{queue}"}} 1.0' in metrics
    assert "dq_queue_oldest_lease_age_seconds" in metrics
    r = call(server, "POST", f"/v1/queues/{dlq}/redrive", json={})
    assert r.status_code == 200 and r.json() == {"moved": 1, "to": [queue], "failed": []}
    got = call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1}).json()
    assert got["items"][0]["value"] == "poison"
    assert got["items"][0]["stats"]["dequeue_count"] == 1
    r = call(server, "POST", f"/v1/queues/{queue}/redrive", json={})
    assert r.status_code == 400 and r.json()["error"] == "not_a_dead_letter_queue"
    assert "'to'" in r.json()["message"]


def test_browse_previews_values(server: LiveServer, queue: str) -> None:
    """value_bytes cuts each value to a preview (a text value at a character boundary,
    so it stays text); value_size is still the whole value's."""
    enqueue(
        server,
        queue,
        {"value": "h\u00e9llo w\u00f6rld"},
        {"value": "AAEC/wQF", "encoding": "base64"},
    )
    params = {"values": "true", "value_bytes": "2"}
    page = call(server, "GET", f"/v1/queues/{queue}/items", params=params).json()["items"]
    assert [(i["value"], i["encoding"], i["value_size"]) for i in page] == [
        ("h", "utf-8", 13),  # "h" and half of "\u00e9" are 2 bytes: the half is left out
        ("AAE=", "base64", 6),
    ]
    r = call(server, "GET", f"/v1/queues/{queue}/items", params={**params, "value_bytes": "0"})
    assert r.status_code == 422


def dead_letter_one(server: LiveServer, queue: str, value: str) -> int:
    """Enqueue ``value`` into ``queue`` (max_deliveries 1) and let it die; its old id."""
    config = {"max_deliveries": 1, "default_lease_ms": 100}
    assert call(server, "PUT", f"/v1/queues/{queue}", json=config).status_code == 200
    old_id: int = enqueue(server, queue, {"value": value})[0]["id"]
    before = call(server, "GET", f"/v1/queues/{queue}").json()["stats"]["dead_lettered"]
    call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1})
    time.sleep(0.3)  # the lease runs out; the next dequeue finds it over max_deliveries
    call(server, "POST", f"/v1/queues/{queue}/dequeue", json={"count": 1})
    give_up = time.monotonic() + 5
    while call(server, "GET", f"/v1/queues/{queue}").json()["stats"]["dead_lettered"] == before:
        assert time.monotonic() < give_up, "the item was not dead-lettered"
        time.sleep(0.05)
    return old_id


def test_a_moved_item_peeks_as_where_it_went(server: LiveServer, queue: str) -> None:
    """Dead-lettering and redrive give the item a new id in another queue; a peek of
    the old id says "gone" and where it went (queue and new id), and so on down the
    chain of moves."""
    old_id = dead_letter_one(server, queue, "poison")
    dlq = f"{queue}.dlq"
    gone = call(server, "GET", f"/v1/queues/{queue}/items/{old_id}").json()
    assert gone["state"] == "gone"
    dead_id = gone["moved_to"]["id"]
    assert gone["moved_to"] == {"queue": dlq, "id": dead_id}
    dead = call(server, "GET", f"/v1/queues/{dlq}/items/{dead_id}").json()
    assert dead["state"] == "due" and dead["value"] == "poison" and "moved_to" not in dead

    r = call(server, "POST", f"/v1/queues/{dlq}/redrive", json={})
    assert r.json()["moved"] == 1
    redriven = call(server, "GET", f"/v1/queues/{dlq}/items/{dead_id}").json()
    assert redriven["state"] == "gone" and redriven["moved_to"]["queue"] == queue
    back_id = redriven["moved_to"]["id"]
    assert back_id > old_id
    back = call(server, "GET", f"/v1/queues/{queue}/items/{back_id}").json()
    assert back["state"] == "due" and back["value"] == "poison"
    # the old id still points at its first move; a released item names no move
    again = call(server, "GET", f"/v1/queues/{queue}/items/{old_id}").json()
    assert again["moved_to"] == {"queue": dlq, "id": dead_id}
    dequeue = {"count": 1, "lease_ms": 60_000}
    (item,) = call(server, "POST", f"/v1/queues/{queue}/dequeue", json=dequeue).json()["items"]
    done = {"items": [{"id": item["id"], "receipt": item["receipt"]}]}
    assert call(server, "POST", f"/v1/queues/{queue}/release", json=done).json()["results"][0]["ok"]
    released = call(server, "GET", f"/v1/queues/{queue}/items/{back_id}").json()
    assert released["state"] == "gone" and "moved_to" not in released


def test_backup_route_writes_a_copy_a_server_can_start_on(
    server: LiveServer, queue: str, tmp_path: Path
) -> None:
    enqueue(server, queue, *({"value": f"b{i}"} for i in range(10)))
    r = call(server, "POST", "/v1/backup", json={"dest": str(tmp_path / "x")})
    assert r.status_code == 403 and r.json()["error"] == "backup_disabled"
    backups = tmp_path / "backups"
    backups.mkdir()
    with live_server(tmp_path / "data", env={"DQ_BACKUP_DIR": str(backups)}) as src:
        _backup_and_restore(src, queue, backups)


def _backup_and_restore(server: LiveServer, queue: str, backups: Path) -> None:
    enqueue(server, queue, *({"value": f"b{i}"} for i in range(10)))
    r = call(server, "POST", "/v1/backup", json={"dest": "../escape"})
    assert r.status_code == 400 and "inside the backup directory" in r.json()["message"]
    dest = backups / "copy"
    r = call(server, "POST", "/v1/backup", json={"dest": "copy"})
    assert r.status_code == 200, r.text
    assert r.json()["path"] == str(dest) and r.json()["bytes"] > 0
    r = call(server, "POST", "/v1/backup", json={"dest": str(dest)})
    assert r.status_code == 400 and "exists" in r.json()["message"]
    with live_server(dest) as restored:
        got = httpx.post(
            f"{restored.url}/v1/queues/{queue}/dequeue", json={"count": 100}, timeout=30
        ).json()
        assert [i["value"] for i in got["items"]] == [f"b{i}" for i in range(10)]


def test_bad_input_answers_say_what_to_fix(server: LiveServer, queue: str) -> None:
    url = f"/v1/queues/{queue}/items"
    r = call(server, "POST", url, json={"items": [{"value": "a", "deadline": 1, "delay_ms": 2}]})
    assert r.status_code == 422 and r.json()["error"] == "validation_error"
    assert r.json()["details"][0]["loc"] == ["body", "items", "0", "delay_ms"]
    r = call(server, "POST", url, content=b'{"items": [{"value": "a"}]}')  # no content-type
    assert r.status_code == 422 and "Content-Type: application/json" in r.json()["message"]
    r = call(server, "POST", url, json={"items": [{"value": "a!!", "encoding": "base64"}]})
    message = r.json()["message"]
    assert r.status_code == 422 and message.count("not valid base64") == 1, message
    r = call(server, "POST", url, json={"items": [{"value": "a", "delay_ms": 2**48 - 1}]})
    assert r.status_code == 400 and r.json()["error"] == "invalid_deadline"
    assert "delay_ms" in r.json()["message"], r.json()  # what was sent, not a sum of it
    r = call(server, "PATCH", f"/v1/queues/{queue}")
    assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"
    assert r.headers["allow"] == "DELETE, GET, PUT"  # every method of the path
    r = call(server, "PUT", f"/v1/queues/{queue}/items")
    assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, POST"
    for method, path, allow in (("PATCH", "/v1/queues", "GET"), ("GET", "/v1/backup", "POST")):
        r = call(server, method, path)  # two segments, like an SQS queue URL: still dq's
        assert r.status_code == 405 and r.headers["allow"] == allow, (path, r.text)
    assert call(server, "GET", "/000000000000/q").status_code == 404  # an SQS queue URL
    r = call(server, "GET", f"/v1/queues/{queue}/items/abc")
    assert r.status_code == 422 and r.json()["details"][0]["loc"] == ["path", "item_id"]
    assert call(server, "GET", f"/v1/queues/{queue}").status_code == 404  # nothing was written


def test_deleting_a_dead_letter_queue_in_use_needs_force(server: LiveServer, queue: str) -> None:
    """DELETE of a queue other queues send their dead letters to answers 409
    dead_letter_queue_in_use and deletes nothing; ``?force=true`` deletes it. Once no
    queue names it (its source reconfigured), a plain DELETE does."""
    config = {"max_deliveries": 2, "dead_letter_queue": f"{queue}-dead"}
    assert call(server, "PUT", f"/v1/queues/{queue}", json=config).status_code == 200
    assert call(server, "PUT", f"/v1/queues/{queue}-b", json=config).status_code == 200
    enqueue(server, f"{queue}-dead", {"value": "kept"})
    r = call(server, "DELETE", f"/v1/queues/{queue}-dead")
    assert r.status_code == 409 and r.json()["error"] == "dead_letter_queue_in_use"
    assert f"the dead-letter queue of {queue}, {queue}-b:" in r.json()["message"]
    r = call(server, "DELETE", f"/v1/queues/{queue}-dead", params={"force": "false"})
    assert r.status_code == 409
    assert call(server, "GET", f"/v1/queues/{queue}-dead").json()["stats"]["pending"] == 1
    r = call(server, "DELETE", f"/v1/queues/{queue}-dead", params={"force": "true"})
    assert r.status_code == 204
    enqueue(server, f"{queue}-dead", {"value": "again"})  # what a dead letter would do
    for source in (queue, f"{queue}-b"):
        assert call(server, "PUT", f"/v1/queues/{source}", json={}).status_code == 200
    assert call(server, "DELETE", f"/v1/queues/{queue}-dead").status_code == 204
