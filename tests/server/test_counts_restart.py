"""A real ``dq serve`` restarted: its due and delayed counts stay exact once the items
are in segment files, read the ways an operator reads them (the HTTP API, ``dq stats``,
``dq queues``, the ``/metrics`` gauges), and delayed items become due as time passes,
with no restart and no write."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dq.client import Client, NewItem
from tests.server.live import REPO, LiveServer, live_server

# integration: live dq serve processes, restarted
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

HOUR_MS = 3_600_000
QUEUE = "jobs"
#: ~60 items of this size fill a segment file's 64 KiB block
VALUE = b"x" * 1000


def http_stats(server: LiveServer) -> dict[str, Any]:
    answer = httpx.get(f"{server.url}/v1/queues/{QUEUE}", timeout=10)
    answer.raise_for_status()
    stats: dict[str, Any] = answer.json()["stats"]
    return stats


def cli(server: LiveServer, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", *args, "--json", "--url", server.url],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def gauges(server: LiveServer) -> dict[str, float]:
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("queue") == QUEUE:
                out[sample.name] = sample.value
    return out


def counts_everywhere(server: LiveServer) -> list[tuple[int, int, int, int]]:
    """(pending, due, delayed, leased) as the API, ``dq stats``, ``dq queues`` and
    ``/metrics`` give them."""
    names = ("pending", "due", "delayed", "leased")
    api = http_stats(server)
    one = cli(server, "stats", QUEUE)["stats"]
    (listed,) = [q["stats"] for q in cli(server, "queues") if q["name"] == QUEUE]
    metrics = gauges(server)
    return [
        tuple(int(source[n]) for n in names)  # type: ignore[misc]
        for source in (api, one, listed)
    ] + [tuple(int(metrics[f"dq_queue_{n}"]) for n in names)]  # type: ignore[list-item]


def in_segment_files(server: LiveServer, timeout: float = 60.0) -> None:
    """Wait until the restarted server has written every log into a segment file."""
    give_up = time.monotonic() + timeout
    while True:
        stats = http_stats(server)
        if stats["segments"] >= 1 and stats["extra"]["frozen"] == 0:
            return
        assert time.monotonic() < give_up, f"logs not frozen in time: {stats}"
        time.sleep(0.1)


def test_due_and_delayed_stay_exact_across_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with live_server(data) as server, Client(server.url) as dq:
        dq.enqueue(QUEUE, b"now")
        dq.enqueue(QUEUE, b"in an hour", delay_ms=HOUR_MS)
        before = counts_everywhere(server)
        assert before == [(2, 1, 1, 0)] * 4
    with live_server(data) as server:
        in_segment_files(server)
        assert counts_everywhere(server) == [(2, 1, 1, 0)] * 4
        stats = http_stats(server)
        assert stats["oldest_due_age_ms"] is not None and stats["oldest_due_age_ms"] < 60_000


def test_hundreds_of_delayed_items_and_released_ones_after_a_restart(tmp_path: Path) -> None:
    """Segment files of many blocks, with released items' tombstones in a later file
    than their entries: none of the delayed items counts as due, none of the released
    ones counts at all, and the oldest due item is the oldest one left."""
    data = tmp_path / "data"
    with (
        live_server(data, env={"DQ_MEMSEG_BYTES": str(1 << 20)}) as server,
        Client(server.url) as dq,
    ):
        now = int(time.time() * 1000)
        due = dq.enqueue_many(
            QUEUE, [NewItem(VALUE, deadline=now - 60_000 + i) for i in range(300)]
        )
        dq.enqueue_many(QUEUE, [NewItem(VALUE, delay_ms=HOUR_MS + i) for i in range(700)])
        got = dq.dequeue(QUEUE, count=100, lease_ms=60_000)
        assert [g.id for g in got] == [e.id for e in due[:100]]
        dq.release_many(QUEUE, got)
        assert counts_everywhere(server) == [(900, 200, 700, 0)] * 4
    with live_server(data) as server:
        in_segment_files(server)
        assert http_stats(server)["segments"] >= 2
        assert counts_everywhere(server) == [(900, 200, 700, 0)] * 4
        age = http_stats(server)["oldest_due_age_ms"]
        oldest_left = due[100].deadline
        assert int(time.time() * 1000) - oldest_left - 10_000 < age
        assert age <= int(time.time() * 1000) - oldest_left


def test_delayed_items_become_due_after_a_restart_without_a_write(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with live_server(data) as server, Client(server.url) as dq:
        soon = dq.enqueue_many(QUEUE, [NewItem(VALUE, delay_ms=6_000) for _ in range(150)])
        dq.enqueue_many(QUEUE, [NewItem(VALUE, delay_ms=HOUR_MS) for _ in range(150)])
    deadline = soon[0].deadline
    with live_server(data) as server:
        in_segment_files(server)
        read_at = int(time.time() * 1000)
        first = counts_everywhere(server)
        if int(time.time() * 1000) < deadline - 500:  # a slow restart may come after it
            assert read_at < deadline and first == [(300, 0, 300, 0)] * 4
        give_up = time.monotonic() + 30
        while int(time.time() * 1000) < deadline + 200:
            assert time.monotonic() < give_up
            time.sleep(0.05)
        assert counts_everywhere(server) == [(300, 150, 150, 0)] * 4
        assert gauges(server)["dq_queue_oldest_due_age_seconds"] > 0
