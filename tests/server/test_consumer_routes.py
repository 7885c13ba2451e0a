"""The consumer protocol and keyed enqueue over HTTP, against a real ``dq serve``."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from dq.client import Client
from dq.client.errors import ValidationError
from dq.client.groups import ConsumerClient, KeyedEnqueuer
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve


def test_protocol_round_trip_keeps_binary_values(server: LiveServer) -> None:
    values = [bytes([i, 0xFF, 0x00, i]) for i in range(50)] + [b"plain text"]
    with Client(server.url) as dq, ConsumerClient(server.url, "rt", "c1") as c:
        ids = [e.id for e in dq.enqueue_many("rt", values)]
        info = c.open(lease_ms=60_000)
        assert (info.first_unacked, info.queue_due) == (0, 51)
        got = c.pull(info.first_unacked, 100)
        assert (got.start, got.end, got.pulled) == (0, 51, 51)
        read = c.read(10, 20)
        assert read.found and read.epoch == got.epoch
        assert [i.value for i in read.items] == values[10:20]
        assert [i.id for i in read.items] == ids[10:20]
        assert {i.dequeue_count for i in read.items} == {1}
        assert c.read(0, 51).items[-1].value == b"plain text"
        done = c.commit(51)
        assert (done.released, done.stale, done.first_unacked) == (51, 0, 51)
        assert dq.queue("rt").stats.pending == 0


def test_unknown_consumer(server: LiveServer) -> None:
    with ConsumerClient(server.url, "nobody", "ghost") as c:
        assert c.info() is None
        assert not c.delete()
        assert c.read(0, 10).found is False
    r = httpx.get(f"{server.url}/v1/queues/nobody/consumers/ghost", timeout=5)
    assert (r.status_code, r.json()["error"]) == (404, "consumer_not_found")


def test_bad_input_is_a_4xx(server: LiveServer) -> None:
    with ConsumerClient(server.url, "bad", "c") as c, pytest.raises(ValidationError):
        c.pull(-1, 10)
    r = httpx.post(
        f"{server.url}/v1/queues/bad/batches",
        json={"key": "k", "items": [{"value": "!!", "encoding": "base64"}]},
        timeout=5,
    )
    assert r.status_code == 400 and r.json()["error"] == "invalid_value"
    r = httpx.put(f"{server.url}/v1/queues/bad/consumers/no%20spaces", timeout=5)
    assert r.status_code == 422


def test_keyed_batch_runs_once(server: LiveServer) -> None:
    items = [(f"row{i}".encode(), None, None) for i in range(10)]
    with KeyedEnqueuer(server.url, "keyed") as q, Client(server.url) as dq:
        ids, replayed = q.enqueue("write-1:0:0", items)
        again, replayed_again = q.enqueue("write-1:0:0", items)
        assert (replayed, replayed_again) == (False, True)
        assert again == ids
        _, other = q.enqueue("write-1:1:0", items[:3])
        assert not other
        assert dq.queue("keyed").stats.pending == 13


def test_server_restart_redelivers_unacknowledged(tmp_path: Path) -> None:
    """The log is memory only: after a restart its items are pending again (at-least-once)."""
    with live_server(tmp_path / "data") as s:
        with Client(s.url) as dq:
            dq.enqueue_many("restart", [f"v{i}".encode() for i in range(20)])
        with ConsumerClient(s.url, "restart", "c") as c:
            got = c.pull(0, 20)
            assert got.end == 20
        s.terminate(timeout=15)
        s.start()
        with ConsumerClient(s.url, "restart", "c") as c:
            assert c.read(0, 20).found is False  # executors skip the void range
            c.commit(20)  # Spark commits the batch it ran
            again = c.pull(20, 100)
            assert (again.start, again.end) == (20, 40)  # sequences never go backwards
            items = c.read(20, 40).items
            assert sorted(i.value for i in items) == sorted(f"v{i}".encode() for i in range(20))
            # dequeue is not durable, so a restart does not count the lost delivery
            assert all(i.dequeue_count >= 1 for i in items)
            assert c.commit(40).released == 20
