"""The schedule routes through the app (its lifespan runs the scheduler), as curl uses
them: create, read with next runs and progress, list, pause, resume, run, delete; bad
definitions answered 400 naming what is wrong, and nothing written."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server.in_app import Call, run_in_app


def run(tmp_path: Path, call: Call, **settings: object) -> object:
    """``call`` against the app in process, without the shared-memory server."""
    return run_in_app(tmp_path, call, shm=False, **settings)


async def items(http: httpx.AsyncClient, queue: str) -> list[dict[str, Any]]:
    r = await http.get(f"/v1/queues/{queue}/items", params={"limit": 1000, "values": "true"})
    assert r.status_code == 200, r.text
    got: list[dict[str, Any]] = r.json()["items"]
    return got


def test_a_schedule_is_made_read_listed_and_fires(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        r = await http.put(
            "/v1/queues/reports/schedules/daily",
            json={"cron": "0 9 * * MON-FRI", "timezone": "Europe/Berlin", "value": "go"},
        )
        assert r.status_code == 200, r.text
        daily = r.json()
        assert daily["cron"] == "0 9 * * MON-FRI" and daily["timezone"] == "Europe/Berlin"
        assert daily["catch_up"] == "latest" and daily["paused"] is False
        assert daily["last_tick"] is None and daily["fired"] == 0 and len(daily["next"]) == 5
        assert daily["value"] == "go" and daily["encoding"] == "utf-8"
        r = await http.put(
            "/v1/queues/reports/schedules/beat",
            json={
                "every_ms": 200,
                "value": "/w==",
                "encoding": "base64",
                "group": "pulse",
                "catch_up": "all",
            },
        )
        assert r.status_code == 200, r.text
        # the answer's next runs are those after it was written: a tick may fall due
        # between the schedule's making and the answer (a slow write), and fires
        created, first_next = r.json()["created"], r.json()["next"][0]
        await asyncio.sleep(1.3)
        got = await items(http, "reports")
        assert len(got) >= 4
        assert all(i["value"] == "/w==" and i["encoding"] == "base64" for i in got)
        assert {i["group"] for i in got} == {"pulse"}  # each tick's item has the group
        ticks = [i["deadline"] for i in got]
        assert ticks[0] == created - created % 200 + 200  # the first tick after its making
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 200)) and first_next in ticks
        # read after the items: more ticks may have fired meanwhile, each once
        beat = (await http.get("/v1/queues/reports/schedules/beat")).json()
        assert beat["last_tick"] >= ticks[-1]
        assert beat["fired"] == (beat["last_tick"] - ticks[0]) // 200 + 1
        assert beat["lateness_ms"] is not None and beat["lateness_ms"] >= 0
        assert all(n > ticks[-1] for n in beat["next"])
        listed = (await http.get("/v1/queues/reports/schedules")).json()["schedules"]
        assert [s["name"] for s in listed] == ["beat", "daily"]
        # each item answers to its tick's key
        r = await http.post(
            "/v1/queues/reports/items",
            json={"items": [{"value": "x", "key": f"schedule:beat:{ticks[0]}"}]},
        )
        assert r.json()["items"][0]["duplicate"] is True
        assert r.json()["items"][0]["id"] == got[0]["id"]

    run(tmp_path, call, schedule_min_every_ms=100)


def test_pause_resume_run_and_delete(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        base = "/v1/queues/jobs/schedules/beat"
        assert (await http.put(base, json={"every_ms": 150})).status_code == 200
        r = await http.post(base + "/pause")
        assert r.status_code == 200 and r.json()["paused"] is True and r.json()["next"] == []
        before = len(await items(http, "jobs"))
        await asyncio.sleep(0.6)
        assert len(await items(http, "jobs")) == before  # a paused schedule fires nothing
        r = await http.post(base + "/run")
        assert r.status_code == 200
        ran = r.json()
        assert ran["key"].startswith("schedule:beat:run:")
        assert [i["id"] for i in await items(http, "jobs")][-1] == ran["id"]
        r = await http.post(base + "/resume")
        assert r.json()["paused"] is False and len(r.json()["next"]) == 5
        await asyncio.sleep(0.6)
        assert len(await items(http, "jobs")) > before + 1
        assert (await http.delete(base)).status_code == 204
        r = await http.get(base)
        assert r.status_code == 404 and r.json()["error"] == "schedule_not_found"
        left = len(await items(http, "jobs"))
        await asyncio.sleep(0.5)
        assert len(await items(http, "jobs")) == left  # deleted: fires no more; items stay
        r = await http.post(base + "/run")
        assert r.status_code == 404

    run(tmp_path, call, schedule_min_every_ms=100)


def test_bad_definitions_are_refused_with_400_naming_the_problem(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        base = "/v1/queues/jobs/schedules/s"
        for body, words in (
            ({"cron": "0 9 * * *", "timezone": "Europe/Nowhere"}, "unknown time zone"),
            ({"cron": "* * */20 * 1L"}, "never fire"),
            ({"cron": "0 25 * * *"}, "Bad hour"),
            ({"every_ms": 500}, "at most every 1000 ms"),
            ({"at": "2001-01-01T00:00:00Z"}, "its time has passed"),
            ({"every_ms": 1000, "catch_up": "sometimes"}, "catch_up must be"),
            ({}, "exactly one of cron, every_ms and at"),
            ({"every_ms": 1000, "value": "!!", "encoding": "base64"}, "base64"),
            ({"every_ms": 1000, "group": "a b\u00e9"}, "group"),
        ):
            r = await http.put(base, json=body)
            assert r.status_code == 400, (body, r.text)
            assert r.json()["error"] == "invalid_schedule" and words in r.json()["message"]
        r = await http.put("/v1/queues/jobs/schedules/.dot", json={"every_ms": 1000})
        assert r.status_code == 400 and "schedule names" in r.json()["message"]
        r = await http.put(base, json={"every_ms": "often"})
        assert r.status_code == 422
        r = await http.get("/v1/queues/jobs")
        assert r.status_code == 404  # nothing was written, not even the queue

    run(tmp_path, call)


@pytest.mark.integration  # the restart freezes the log in a worker process
def test_definitions_and_progress_survive_a_restart(tmp_path: Path) -> None:
    async def first(http: httpx.AsyncClient) -> int:
        await http.put("/v1/queues/q/schedules/beat", json={"every_ms": 100, "catch_up": "skip"})
        await asyncio.sleep(0.5)
        fired: int = (await http.get("/v1/queues/q/schedules/beat")).json()["fired"]
        assert fired >= 3
        return fired

    fired = run(tmp_path, first, schedule_min_every_ms=100)
    stopped = int(time.time() * 1000)
    time.sleep(0.5)  # down: ticks are missed
    restarted = int(time.time() * 1000)

    async def second(http: httpx.AsyncClient) -> None:
        await asyncio.sleep(0.3)
        # paused, so that no tick fires between reading the count and the items (one
        # did on a loaded machine, 100 ms apart); a tick already on its way when the
        # pause came may still land, so the two are read until they agree
        assert (await http.post("/v1/queues/q/schedules/beat/pause")).status_code == 200
        give_up = time.monotonic() + 10
        while True:
            beat = (await http.get("/v1/queues/q/schedules/beat")).json()
            ticks = [i["deadline"] for i in await items(http, "q")]
            if len(ticks) == beat["fired"] or time.monotonic() > give_up:
                break
            await asyncio.sleep(0.05)
        assert beat["every_ms"] == 100 and beat["fired"] > fired
        assert len(ticks) == len(set(ticks)) == beat["fired"]  # each tick once
        assert [t for t in ticks if stopped < t < restarted] == []  # catch_up skip

    run(tmp_path, second, schedule_min_every_ms=100)


def test_every_queues_schedules_a_page_at_a_time(tmp_path: Path) -> None:
    async def call(http: httpx.AsyncClient) -> None:
        made = [(q, f"s{n}") for q in ("b", "a", "c") for n in range(4)]
        for queue, name in made:
            r = await http.put(f"/v1/queues/{queue}/schedules/{name}", json={"cron": "0 0 * * *"})
            assert r.status_code == 200, r.text
        seen: list[tuple[str, str]] = []
        after = None
        for _ in range(10):
            params: dict[str, Any] = {"limit": 5}
            if after:
                params["after"] = after
            page = (await http.get("/v1/schedules", params=params)).json()
            seen += [(s["queue"], s["name"]) for s in page["schedules"]]
            assert len(page["schedules"]) <= 5
            after = page["next"]
            if after is None:
                break
        assert seen == sorted(made)
        r = await http.get("/v1/schedules", params={"limit": 0})
        assert r.status_code == 422

    run(tmp_path, call)
