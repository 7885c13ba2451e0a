"""``dq schedule`` as a user runs it: ``dq`` subprocesses against a live server. A
schedule is put, shown with its next runs, fires, is listed, paused, run, resumed and
deleted; bad definitions are one line on stderr naming what is wrong, exit 1."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.cli.test_operate import run
from tests.server.live import LiveServer, live_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    env = {"DQ_SCHEDULE_MIN_EVERY_MS": "200"}
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=env) as s:
        yield s


def dq(server: LiveServer, *args: str) -> tuple[int, str, str]:
    r = run("schedule", *args, "--url", server.url)
    return r.returncode, r.stdout, r.stderr


def test_a_schedule_from_the_command_line(fast: LiveServer) -> None:
    code, out, err = dq(
        fast,
        "put", "reports", "weekday-report", "--cron", "0 9 * * MON-FRI",
        "--timezone", "Europe/Berlin", "--value", '{"report": "sales"}', "--group", "sales",
    )  # fmt: skip
    assert code == 0, err
    assert "schedule weekday-report of reports: cron 0 9 * * MON-FRI (Europe/Berlin)" in out
    assert "group sales" in out and "fired 0 ticks; last none yet" in out
    assert out.count("T09:00:00.000") + out.count(":00:00.000") >= 5  # the next five runs

    code, out, err = dq(fast, "put", "reports", "beat", "--every-ms", "200", "--catch-up", "all")
    assert code == 0, err
    give_up = time.monotonic() + 20
    while True:
        code, out, err = dq(fast, "show", "reports", "beat", "--json")
        shown = json.loads(out)
        if shown["fired"] >= 3 or time.monotonic() > give_up:
            break
        time.sleep(0.2)
    assert shown["fired"] >= 3 and shown["last_tick"] is not None and len(shown["next"]) == 5

    code, out, err = dq(fast, "list", "reports")
    assert code == 0, err
    assert "beat" in out and "weekday-report" in out and "every 200 ms" in out

    code, out, err = dq(fast, "pause", "reports", "beat")
    assert code == 0 and "(paused)" in out
    code, out, err = dq(fast, "run", "reports", "beat")
    assert code == 0 and "key schedule:beat:run:" in out
    code, out, err = dq(fast, "resume", "reports", "beat", "--json")
    assert code == 0 and json.loads(out)["paused"] is False
    code, out, err = dq(fast, "delete", "reports", "beat")
    assert code == 0 and "its items stay" in out
    code, out, err = dq(fast, "show", "reports", "beat")
    assert code == 1 and "schedule_not_found" in err


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--cron", "0 9 * * *", "--timezone", "Europe/Nowhere"], "unknown time zone"),
        (["--cron", "* * */20 * 1L"], "never fire"),
        (["--every-ms", "100"], "at most every 200 ms"),
        (["--at", "2001-01-01T00:00:00Z"], "its time has passed"),
    ],
)
def test_bad_definitions_say_what_is_wrong(fast: LiveServer, args: list[str], words: str) -> None:
    code, out, err = dq(fast, "put", "bad", "s", *args)
    assert code == 1 and out == ""
    assert err.startswith("dq schedule: ") and "invalid_schedule" in err and words in err
    assert len(err.strip().splitlines()) == 1


def test_put_needs_exactly_one_way_to_fire(fast: LiveServer) -> None:
    code, _out, err = dq(fast, "put", "q", "s", "--cron", "* * * * *", "--every-ms", "1000")
    assert code == 2 and "not allowed with argument" in err
    code, _out, err = dq(fast, "put", "q", "s")
    assert code == 2 and "one of the arguments --cron --every-ms --at is required" in err
