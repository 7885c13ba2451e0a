"""An item's group, the way a user meets it: given at enqueue (the client, raw HTTP, the
``dq put --group`` command), returned on every delivery, peek and browse, and kept
through what happens to an item — segment files and merges, a SIGKILL and restart, a
requeue, a lease running out, a move to the dead-letter queue (``docs/delivery.md``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dq.client import Client, NewItem, QueueConfig
from tests.server.live import REPO, live_server

pytestmark = pytest.mark.integration

#: small in-memory segments, so most items live in segment files (and merge)
ENV = {"DQ_MEMSEG_BYTES": "4096", "DQ_EXPIRE_INTERVAL_MS": "50"}


def group_for(n: int) -> str | None:
    return None if n % 5 == 0 else f"customer-{n % 7} ~!"


def test_groups_survive_segment_files_merges_and_a_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    want: dict[int, str | None] = {}
    with live_server(data, env=ENV) as server, Client(server.url) as dq:
        for start in range(0, 600, 100):
            items = [
                NewItem(b"v%04d" % n + b"." * 100, group=group_for(n))
                for n in range(start, start + 100)
            ]
            for n, done in zip(
                range(start, start + 100), dq.enqueue_many("jobs", items), strict=True
            ):
                want[done.id] = group_for(n)
        one = dq.enqueue("jobs", "single", group="solo")
        want[one] = "solo"
        raw = httpx.post(
            server.url + "/v1/queues/jobs/items",
            json={"items": [{"value": "raw", "group": "by-http"}]},
        )
        assert raw.status_code == 200, raw.text
        want[raw.json()["items"][0]["id"]] = "by-http"
        assert dq.queue("jobs").stats.segments >= 1  # the groups are in segment files too
        peeked = dq.peek("jobs", one)
        assert peeked.group == "solo" and peeked.state == "due"
        server.kill()
        server.start()
        page = dq.browse("jobs", state="due", limit=50)
        assert [i.group for i in page.items] == [want[i.id] for i in page.items]
        got = {}
        while len(got) < len(want):
            batch = dq.dequeue("jobs", 100, lease_ms=60_000)
            assert batch, f"only {len(got)} of {len(want)} came back"
            got.update({i.id: i.group for i in batch})
        assert got == want
        leased = dq.peek("jobs", one)
        assert leased.state == "leased" and leased.group == "solo"


def test_requeue_expiry_and_dead_letters_keep_the_group(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        dq.put_queue("mail", QueueConfig(max_deliveries=3, dead_letter_queue="mail.dead"))
        item_id = dq.enqueue("mail", "hello", group="tenant-a")
        (first,) = dq.dequeue("mail", 1, lease_ms=60_000)
        assert first.group == "tenant-a"
        dq.requeue("mail", first.id, first.receipt, delay_ms=0)
        (second,) = dq.dequeue("mail", 1, lease_ms=100)  # its lease runs out
        assert (second.id, second.group) == (item_id, "tenant-a")
        give_up = time.monotonic() + 10
        third = dq.dequeue("mail", 1, lease_ms=60_000, wait_ms=2000)
        while not third and time.monotonic() < give_up:
            third = dq.dequeue("mail", 1, lease_ms=60_000, wait_ms=500)
        assert [(i.id, i.group, i.stats.dequeue_count) for i in third] == [(item_id, "tenant-a", 3)]
        dq.requeue("mail", item_id, third[0].receipt, delay_ms=0)
        assert not dq.dequeue("mail", 1, wait_ms=200)  # the 4th delivery dead-letters it
        give_up = time.monotonic() + 10
        dead = dq.dequeue("mail.dead", 1, wait_ms=1000)
        while not dead and time.monotonic() < give_up:
            dead = dq.dequeue("mail.dead", 1, wait_ms=500)
        assert [i.group for i in dead] == ["tenant-a"]
        dq.requeue("mail.dead", dead[0].id, dead[0].receipt, delay_ms=0)
        assert dq.redrive("mail.dead").moved == 1
        back = dq.dequeue("mail", 1, wait_ms=1000)
        assert [i.group for i in back] == ["tenant-a"]


def test_a_bad_group_is_refused_and_nothing_written(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        dq.enqueue("q", "first")
        for bad in ["", "x" * 129, "tab\there", "é", 7]:
            r = httpx.post(
                server.url + "/v1/queues/q/items",
                json={"items": [{"value": "ok"}, {"value": "bad", "group": bad}]},
            )
            assert r.status_code in (400, 422), r.text
            if isinstance(bad, str):
                assert r.json()["error"] == "invalid_group", r.text
        assert dq.queue("q").stats.pending == 1
        assert dq.enqueue("q", "edge", group=" " + "~" * 127) > 0


def test_dq_put_group(tmp_path: Path) -> None:
    with live_server(tmp_path / "data", env=ENV) as server, Client(server.url) as dq:
        done = subprocess.run(
            [sys.executable, "-m", "dq.cli.main", "put", "--url", server.url, "jobs", "a", "b",
             "--group", "tenant-7"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        got = subprocess.run(
            [sys.executable, "-m", "dq.cli.main", "get", "--url", server.url, "jobs", "--count",
             "5", "--json"],
            cwd=REPO, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert got.returncode == 0, got.stderr
        assert [i["group"] for i in json.loads(got.stdout)] == ["tenant-7", "tenant-7"]
        assert dq.queue("jobs").stats.leased == 2
