"""The delivery rules the way a user meets them (``docs/delivery.md``): set with
``PUT /v1/queues/{queue}`` (the client's ``put_queue``), kept in ``queue.json`` across a
restart, refused in the one wording of each rule, and obeyed by dequeues over HTTP and
over the ring — the page's examples as written: one ordered group per customer, at
most 5 jobs per tenant, tenants served in turn, 50 deliveries a second — with their
figures in stats, ``/metrics`` and ``GET /v1/queues/{queue}/groups``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from dq.client import Client, NewItem, QueueConfig, RateLimit
from tests.server.live import LiveServer, live_server, served

pytestmark = pytest.mark.integration  # a live dq serve, over HTTP and its rings

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "50", "DQ_MAX_WAIT_MS": "5000"}


server, http = served(ENV)


@pytest.fixture
def ring(server: LiveServer) -> Iterator[Client]:
    with Client(f"shm://{server.data_dir}") as c:
        yield c


def _put(server: LiveServer, queue: str, body: object) -> httpx.Response:
    return httpx.put(f"{server.url}/v1/queues/{queue}", json=body, timeout=10)


def test_one_ordered_group_per_customer(server: LiveServer, http: Client, ring: Client) -> None:
    """group_limit 1: a customer's events one at a time and in order, while different
    customers go in parallel — to consumers over HTTP and over the ring alike."""
    http.put_queue("events", QueueConfig(group_limit=1))
    http.enqueue("events", b'{"op": "open"}', group="customer-42")
    http.enqueue("events", b'{"op": "charge"}', group="customer-42")
    http.enqueue("events", b'{"op": "open"}', group="customer-7")
    (first,) = http.dequeue("events", 1)
    (second,) = ring.dequeue("events", 1)
    assert (first.value, second.value) == (b'{"op": "open"}', b'{"op": "open"}')
    assert first.group == "customer-42"
    assert http.dequeue("events", 5) == [] and ring.dequeue("events", 5) == []
    info = http.queue("events")
    assert (info.stats.groups, info.stats.held, info.stats.due) == (2, 1, 1)
    http.release("events", first.id, first.receipt)
    (charge,) = ring.dequeue("events", 5, wait_ms=2000)
    assert charge.value == b'{"op": "charge"}'


def test_at_most_five_jobs_per_tenant(server: LiveServer, http: Client, ring: Client) -> None:
    http.put_queue("jobs", QueueConfig(group_limit=5))
    a = http.enqueue_many(
        "jobs", [NewItem(b'{"render": %d}' % n, group="tenant-a") for n in range(9)]
    )
    b = http.enqueue("jobs", b'{"render": 0}', group="tenant-b")
    tenant = {e.id: "tenant-a" for e in a} | {b: "tenant-b"}
    got = ring.dequeue("jobs", 4) + http.dequeue("jobs", 10)
    assert sorted(tenant[i.id] for i in got) == ["tenant-a"] * 5 + ["tenant-b"]
    groups = {g.group: g for g in http.groups("jobs")}
    assert (groups["tenant-a"].leased, groups["tenant-a"].due, groups["tenant-a"].held) == (5, 4, 4)
    raw = httpx.get(f"{server.url}/v1/queues/jobs/groups?limit=1", timeout=10).json()
    assert raw == {"groups": [{"group": "tenant-a", "leased": 5, "due": 4, "held": 4}]}
    first = next(i for i in got if tenant[i.id] == "tenant-a")
    http.release("jobs", first.id, first.receipt)
    assert len(http.dequeue("jobs", 10)) == 1


def test_tenants_served_in_turn(http: Client) -> None:
    http.put_queue("reports", QueueConfig(fair=True))
    http.enqueue_many("reports", [NewItem(b"a%d" % n, group="tenant-a") for n in range(300)])
    http.enqueue_many("reports", [NewItem(b"b%d" % n, group="tenant-b") for n in range(2)])
    got = [i.value for _ in range(4) for i in http.dequeue("reports", 1)]
    assert got == [b"a0", b"b0", b"a1", b"b1"]  # not 300 of tenant-a's first


def test_fifty_deliveries_a_second(server: LiveServer, http: Client, ring: Client) -> None:
    """A token bucket: the burst at once, then one every 20 ms; a long-poll waits for the
    next token within its wait; the refusals are counted and shown in /metrics.

    The deliveries after the burst are counted against the time since a clock reading
    before it (the bucket was emptied after that reading) and after each answer: at most
    one a 20 ms. A test cannot know how long the machine takes between two calls, so it
    does not say how many a call gets, only that the bucket's rate was never exceeded."""
    http.put_queue("mail", QueueConfig(rate_limit=RateLimit(per_second=50, burst=50)))
    http.enqueue_many("mail", [b"m%d" % n for n in range(120)])
    burst_at = time.monotonic()
    assert len(http.dequeue("mail", 100)) == 50

    def allowed() -> int:
        """The most the bucket can have given since it was emptied, by the clock now
        (with 2 ms for the server's clock: read to the millisecond, and slewed by NTP)."""
        return int((time.monotonic() - burst_at + 0.002) * 50)

    given = len(ring.dequeue("mail", 10))  # none within 20 ms of the burst: the items stay due
    assert given <= allowed()
    start = time.monotonic()
    got = ring.dequeue("mail", 10, wait_ms=3000)
    waited = time.monotonic() - start
    given += len(got)
    assert len(got) >= 1 and waited < 2.5, (len(got), waited)  # woken for the next token
    assert given <= allowed(), given
    while given < 25 and time.monotonic() - start < 10:
        given += len(http.dequeue("mail", 100, wait_ms=1000))
        assert given <= allowed(), given  # 25 tokens take half a second to come
    assert given >= 25
    stats = http.queue("mail").stats
    assert stats.rate_limited >= 1
    metrics = httpx.get(server.url + "/metrics", timeout=10).text
    assert f'dq_queue_rate_limited_total{{queue="mail"}} {float(stats.rate_limited)}' in metrics


def test_config_round_trips_and_lasts_across_a_restart(tmp_path: Path) -> None:
    rate = RateLimit(per_second=2.5, burst=3, per_group=True)
    config = QueueConfig(group_limit=2, leased_limit=10, fair=True, rate_limit=rate)
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        assert dq.put_queue("t", config).config == config
        raw = httpx.get(f"{server.url}/v1/queues/t", timeout=10).json()["config"]
        assert {k: raw[k] for k in ("group_limit", "leased_limit", "fair", "rate_limit")} == {
            "group_limit": 2,
            "leased_limit": 10,
            "fair": True,
            "rate_limit": {"per_second": 2.5, "burst": 3, "per_group": True},
        }
        on_disk = json.loads((tmp_path / "data" / "queues" / "t" / "queue.json").read_text())
        assert on_disk["rate_limit"] == {"per_second": 2.5, "burst": 3, "per_group": True}
        server.kill()
        server.start()
        assert dq.queue("t").config == config
        assert dq.put_queue("t", QueueConfig()).config == QueueConfig()  # rules dropped


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"group_limit": 0}, "group_limit must be between 1 and 4294967295"),
        ({"leased_limit": -5}, "leased_limit must be between 1 and 4294967295"),
        (
            {"rate_limit": {"per_second": 0, "burst": 5}},
            "per_second must be a number above 0 and at most 1000000",
        ),
        ({"rate_limit": {"per_second": 5, "burst": 0}}, "burst must be between 1 and 4294967295"),
        ({"rate_limit": {"per_second": 5}}, "rate_limit.burst: Field required"),
        ({"rate_limit": {"per_second": 5, "burst": 1, "every": 2}}, "rate_limit.every"),
        ({"fair": "sometimes"}, "fair: Input should be a valid boolean"),
    ],
)
def test_rules_out_of_range_are_refused_in_their_words(
    server: LiveServer, http: Client, body: dict[str, object], message: str
) -> None:
    http.put_queue("strict", QueueConfig(group_limit=3))
    r = _put(server, "strict", body)
    assert r.status_code == 422, r.text
    assert r.json()["error"] == "validation_error" and message in r.json()["message"]
    assert http.queue("strict").config.group_limit == 3  # nothing changed
