"""Times on the command line, as a user meets them: ``dq`` subprocesses against a live
server print ISO 8601 local times (raw ms with ``--json``), and ``--deadline`` takes ISO
8601, relative times and ms since the epoch, refusing a number that is plainly seconds
or 1970 before anything is sent.

The subprocesses run in a fixed time zone five and a half hours east of UTC (a POSIX TZ
rule, no time-zone database needed), so the local times printed are known exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from tests.server.live import REPO, LiveServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

#: 2030-01-01T00:00:00Z, and how it reads in the subprocesses' time zone
Y2030_MS = 1_893_456_000_000
Y2030_LOCAL = "2030-01-01T05:30:00.000+05:30"
IST = timezone(timedelta(hours=5, minutes=30))
ENV = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")} | {"TZ": "IST-5:30"}


def dq(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.cli.main", *args, "--url", server.url]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=60)


def pending(server: LiveServer, queue: str) -> int:
    r = httpx.get(f"{server.url}/v1/queues/{queue}", timeout=10)
    return 0 if r.status_code == 404 else int(r.json()["stats"]["pending"])


def test_deadline_takes_iso_8601_and_prints_it_back(server: LiveServer, queue: str) -> None:
    r = dq(server, "put", queue, "a", "--deadline", "2030-01-01T00:00:00Z", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["deadline"] == Y2030_MS  # --json: raw ms
    # no offset: local time
    r = dq(server, "put", queue, "b", "--deadline", "2030-01-01T05:30:00")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\t")[1].strip() == Y2030_LOCAL
    r = dq(server, "put", queue, "c", "--deadline", str(Y2030_MS))  # ms still work
    assert r.stdout.split("\t")[1].strip() == Y2030_LOCAL
    r = dq(server, "browse", queue)
    assert r.returncode == 0 and r.stdout.count(Y2030_LOCAL) == 3, r.stdout
    assert str(Y2030_MS) not in r.stdout
    r = dq(server, "peek", queue, "1")
    assert Y2030_LOCAL in r.stdout and str(Y2030_MS) not in r.stdout


def test_relative_deadlines(server: LiveServer, queue: str) -> None:
    for given, ms in (("+90s", 90_000), ("+5m", 300_000), ("+2h", 7_200_000)):
        before = time.time() * 1000
        r = dq(server, "put", queue, given, "--deadline", given, "--json")
        after = time.time() * 1000
        assert r.returncode == 0, r.stderr
        deadline = json.loads(r.stdout)[0]["deadline"]
        assert before + ms - 1000 <= deadline <= after + ms + 1000, given
    r = dq(server, "put", queue, "past", "--deadline=-10m", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)[0]["deadline"] <= time.time() * 1000 - 590_000


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("1764000000", "looks like seconds since the epoch"),
        ("5", "is in 1970"),
        ("1764000000000000", "micro- or nanoseconds"),
        ("tomorrow", "is not a time"),
    ],
)
def test_a_deadline_plainly_wrong_is_refused(
    server: LiveServer, queue: str, given: str, said: str
) -> None:
    r = dq(server, "put", queue, "x", "--deadline", given)
    assert r.returncode == 2 and said in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert pending(server, queue) == 0  # nothing sent


def local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, IST).isoformat(timespec="milliseconds")


def test_get_requeue_and_stats_print_iso_times(server: LiveServer, queue: str) -> None:
    dq(server, "put", queue, "v", "--deadline", "2000-01-01T00:00:00Z")
    dq(server, "put", queue, "w")
    r = dq(server, "get", queue)  # v: first in deadline order
    assert r.returncode == 0 and "2000-01-01T05:30:00.000+05:30" in r.stdout, r.stdout
    [leased] = json.loads(dq(server, "browse", queue, "--state", "leased", "--json").stdout)[
        "items"
    ]
    expires = leased["lease_expires"]
    assert isinstance(expires, int)  # --json: raw ms
    shown = dq(server, "browse", queue, "--state", "leased").stdout
    assert local(expires) in shown and str(expires) not in shown, shown
    item = json.loads(dq(server, "get", queue, "--json").stdout)[0]
    r = dq(server, "requeue", queue, str(item["id"]), item["receipt"], "--deadline", "+1h")
    assert r.returncode == 0, r.stderr
    text = r.stdout.strip().removeprefix(f"requeued {item['id']} (deadline ").removesuffix(")")
    assert text.endswith("+05:30")
    deadline = datetime.fromisoformat(text).timestamp() * 1000
    assert abs(deadline - (time.time() * 1000 + 3_600_000)) < 60_000
    dq(server, "pause", queue)
    paused_since = json.loads(dq(server, "stats", queue, "--json").stdout)["stats"]["paused_since"]
    assert local(paused_since) in dq(server, "stats", queue).stdout
