"""Schedules across repeated SIGKILLs of a real ``dq serve`` (``--fsync always``): with
``catch_up: all`` every tick from the first to the last is in the queue exactly once —
its deadline the tick, its key ``schedule:{name}:{tick}`` — however the kills fall
between a tick's write, its fsync and its answer. ``fast`` fires into a queue that keeps
no idempotency keys (``dedup_window_ms`` 0), so only the progress written with each
tick keeps it from firing twice. A producer's own keyed enqueues run beside the ticks,
so the kills also meet group commits that mix both."""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.live import LiveServer, browse_all

# integration: live dq serve processes, SIGKILLed
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

Q = "cron"
#: (schedule, interval, queue): "fast"'s queue remembers no keys
SCHEDULES = (("beat", 1000, Q), ("fast", 100, "nokeys"))
ENV = {"DQ_SCHEDULE_MIN_EVERY_MS": "100", "DQ_EXPIRE_INTERVAL_MS": "50"}
KILLS = 5


def _produce(url: str, stop: threading.Event) -> None:
    n = 0
    with httpx.Client(timeout=5) as http:
        while not stop.is_set():
            items = [{"value": "other", "key": f"p-{n}-{i}"} for i in range(5)]
            try:
                http.post(f"{url}/v1/queues/{Q}/items", json={"items": items})
            except httpx.HTTPError:
                time.sleep(0.05)
            n += 1


def test_each_tick_once_across_sigkills(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", fsync="always", env=ENV).start()
    rng = random.Random(7)
    try:
        r = httpx.put(f"{server.url}/v1/queues/nokeys", json={"dedup_window_ms": 0}, timeout=30)
        assert r.status_code == 200, r.text
        for name, every, queue in SCHEDULES:
            r = httpx.put(
                f"{server.url}/v1/queues/{queue}/schedules/{name}",
                json={"every_ms": every, "value": name, "catch_up": "all"},
                timeout=30,
            )
            assert r.status_code == 200, r.text
        for _ in range(KILLS):
            stop = threading.Event()
            producer = threading.Thread(target=_produce, args=(server.url, stop))
            producer.start()
            time.sleep(1.2 + rng.random() * 1.5)
            server.kill()  # SIGKILL at a random instant of the ticks
            stop.set()
            producer.join(10)
            time.sleep(rng.random())  # down for a while: ticks are missed
            server.start()
        time.sleep(1.5)
        server.terminate()
        server.start()  # a graceful restart too
        for name, every, queue in SCHEDULES:
            mine = [i for i in browse_all(server.url, queue, values="true") if i["value"] == name]
            ticks = [i["deadline"] for i in mine]
            assert len(ticks) == len(set(ticks)), f"{name}: a tick twice"
            ticks.sort()
            assert ticks == list(range(ticks[0], ticks[-1] + 1, every)), f"{name}: a tick lost"
            assert len(ticks) >= {"beat": KILLS, "fast": 10 * KILLS}[name]
            info = httpx.get(f"{server.url}/v1/queues/{queue}/schedules/{name}", timeout=30)
            info = info.json()
            assert info["last_tick"] >= ticks[-1] and info["fired"] >= len(ticks)
            if queue != Q:
                continue
            # each item answers to its tick's key (a sample: a key per request)
            for item in rng.sample(mine, 5):
                r = httpx.post(
                    f"{server.url}/v1/queues/{Q}/items",
                    json={"items": [{"value": "x", "key": f"schedule:{name}:{item['deadline']}"}]},
                    timeout=30,
                )
                [again] = r.json()["items"]
                assert (again["id"], again["duplicate"]) == (item["id"], True)
    finally:
        server.kill()
