"""``/metrics`` counts the ticks this server fired and their lateness (tick to item
durable), and how many schedules it fires."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx

from tests.server.test_schedules_http import run


def sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in /metrics"
    return float(m.group(1))


def test_ticks_and_lateness_are_published(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        before = (await http.get("/metrics")).text
        assert sample(before, "dq_schedules") == 0
        assert sample(before, "dq_schedule_ticks_total") == 0
        await http.put("/v1/queues/m/schedules/a", json={"every_ms": 100})
        await http.put("/v1/queues/m/schedules/b", json={"cron": "0 0 1 1 *"})
        await asyncio.sleep(0.8)
        fired = (await http.get("/v1/queues/m/schedules/a")).json()["fired"]
        text = (await http.get("/metrics")).text
        assert sample(text, "dq_schedules") == 2
        ticks = sample(text, "dq_schedule_ticks_total")
        assert ticks >= 5 and abs(ticks - fired) <= 1
        count = sample(text, "dq_schedule_lateness_seconds_count")
        assert count == ticks  # every tick fired within the term has its lateness
        assert sample(text, 'dq_schedule_lateness_seconds_bucket{le="+Inf"}') == count
        assert sample(text, "dq_schedule_lateness_seconds_sum") >= 0
        assert sample(text, "dq_schedule_ticks_skipped_total") == 0
        assert 'dq_requests_total{operation="schedule_put",outcome="ok"} 2.0' in text

    run(tmp_path, call, schedule_min_every_ms=100)


def test_refused_calls_are_counted_by_their_error(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        r = await http.put("/v1/queues/m/schedules/a", json={"every_ms": 1})
        assert r.status_code == 400, r.text
        r = await http.get("/v1/queues/m/schedules/missing")
        assert r.status_code == 404, r.text
        text = (await http.get("/metrics")).text
        refused = r.json()["error"]
        assert 'dq_requests_total{operation="schedule_put",outcome="invalid_schedule"} 1.0' in text
        assert f'dq_requests_total{{operation="schedule_get",outcome="{refused}"}} 1.0' in text
        assert 'dq_requests_total{operation="schedule_put",outcome="ok"} 0.0' in text

    run(tmp_path, call)
