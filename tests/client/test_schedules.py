"""Schedules through the Python client against a live ``dq serve``: ``Client`` over HTTP
and over shared memory (which hands schedule calls to HTTP), and ``AsyncClient``; a
definition made, read, listed, fired, paused, resumed, run and deleted, and bad
definitions refused with the server's words."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import pytest

from dq.client import AsyncClient, BadRequest, Client, NotFound, Schedule
from tests.server.live import LiveServer, live_server


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:  # type: ignore[misc]
    env = {"DQ_SCHEDULE_MIN_EVERY_MS": "200"}
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=env) as s:
        yield s


pytestmark = pytest.mark.integration  # a live dq serve


def wait_for(check: object, timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < give_up, "not in time"
        time.sleep(0.05)


@pytest.mark.parametrize("over", ["http", "shm"])
def test_a_schedule_through_the_client(fast: LiveServer, over: str) -> None:
    url = fast.url if over == "http" else f"shm://{fast.data_dir}"
    queue = f"client-{over}"
    with Client(url) as dq:
        made = dq.put_schedule(queue, "beat", every_ms=200, value=b"\xff\x00", group="g")
        assert isinstance(made, Schedule)
        assert (made.every_ms, made.value, made.group, made.catch_up) == (
            200,
            b"\xff\x00",
            "g",
            "latest",
        )
        assert len(made.next) == 5 and made.last_tick is None
        wait_for(lambda: dq.get_schedule(queue, "beat").fired >= 3)
        got = dq.get_schedule(queue, "beat")
        assert got.last_tick is not None and got.lateness_ms is not None
        page = dq.browse(queue, values=True)
        ticks = sorted(i.deadline for i in page.items if i.value == b"\xff\x00")
        assert ticks[: got.fired] == list(range(ticks[0], ticks[0] + 200 * got.fired, 200))
        paused = dq.pause_schedule(queue, "beat")
        assert paused.paused and paused.next == []
        ran = dq.run_schedule(queue, "beat")
        assert (
            ran.key.startswith("schedule:beat:run:") and dq.peek(queue, ran.id).value == b"\xff\x00"
        )
        assert not dq.resume_schedule(queue, "beat").paused
        when = datetime.now(UTC) + timedelta(days=2)
        dq.put_schedule(queue, "once", at=when, value="later")
        assert [s.name for s in dq.list_schedules(queue)] == ["beat", "once"]
        assert dq.get_schedule(queue, "once").at == int(when.timestamp() * 1000)
        dq.delete_schedule(queue, "beat")
        with pytest.raises(NotFound) as gone:
            dq.get_schedule(queue, "beat")
        assert gone.value.code == "schedule_not_found"


def test_wall_clock_times_and_refusals(fast: LiveServer) -> None:
    with Client(fast.url) as dq:
        local = datetime(2030, 3, 30, 2, 30)  # no zone: 02:30 on Berlin's clocks (CET)
        s = dq.put_schedule("c", "report", at=local, timezone="Europe/Berlin")
        assert s.at == int(datetime(2030, 3, 30, 1, 30, tzinfo=UTC).timestamp() * 1000)
        # the next day the clocks jump from 02:00 to 03:00: 02:30 does not exist, and the
        # time given is the next valid instant, 03:00 CEST
        s = dq.put_schedule("c", "report", at=local + timedelta(days=1), timezone="Europe/Berlin")
        assert s.at == int(datetime(2030, 3, 31, 1, 0, tzinfo=UTC).timestamp() * 1000)
        weekdays = dq.put_schedule(
            "c", "weekdays", cron="0 9 * * MON-FRI", timezone="Europe/Berlin"
        )
        assert len(weekdays.next) == 5
        for kwargs, words in (
            ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
            ({"cron": "* * */20 * 1L"}, "never fire"),
            ({"every_ms": 100}, "at most every 200 ms"),
        ):
            with pytest.raises(BadRequest) as bad:
                dq.put_schedule("c", "bad", **kwargs)  # type: ignore[arg-type]
            assert bad.value.code == "invalid_schedule" and words in str(bad.value)
        with pytest.raises(BadRequest):
            dq.put_schedule("c", "a/b", every_ms=1000)  # refused before anything is sent


def test_async_client(fast: LiveServer) -> None:
    async def go() -> None:
        async with AsyncClient(fast.url) as dq:
            await dq.put_schedule("async", "beat", every_ms=200)
            for _ in range(100):
                if (await dq.get_schedule("async", "beat")).fired >= 2:
                    break
                await asyncio.sleep(0.05)
            assert (await dq.get_schedule("async", "beat")).fired >= 2
            assert (await dq.pause_schedule("async", "beat")).paused
            assert not (await dq.resume_schedule("async", "beat")).paused
            assert (await dq.run_schedule("async", "beat")).id > 0
            assert [s.name for s in await dq.list_schedules("async")] == ["beat"]
            await dq.delete_schedule("async", "beat")
            assert await dq.list_schedules("async") == []

    asyncio.run(go())
