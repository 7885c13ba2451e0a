"""The ``--delay-ms``/``--deadline`` pair (cli/_deadline.py) of every command that sets a
deadline, run as users run it against a live server: ``dq reschedule`` takes a time as
``dq put`` and ``dq requeue`` do (tests/cli/test_times.py drives those), refuses the
same plainly wrong ones before anything is sent, and every such command describes its
flags in the same words."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.server.live import REPO, LiveServer

# integration: runs dq as a process, against a live server
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

Y2030_MS = 1_893_456_000_000  # 2030-01-01T00:00:00Z


def dq(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.cli.main", *args, "--url", server.url]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def deadline_of_key(server: LiveServer, queue: str, key: str) -> int:
    r = dq(server, "peek", queue, "--key", key, "--json")
    assert r.returncode == 0, r.stderr
    deadline: int = json.loads(r.stdout)["deadline"]
    return deadline


def test_reschedule_takes_a_time_as_put_does(server: LiveServer, queue: str) -> None:
    assert dq(server, "create", queue, "--dedup-window-ms", "3600000").returncode == 0
    r = dq(server, "put", queue, "reminder", "--deadline", "+1d", "--key", "r")
    assert r.returncode == 0, r.stderr

    r = dq(server, "reschedule", queue, "--key", "r", "--deadline", "2030-01-01T00:00:00Z")
    assert r.returncode == 0, r.stderr
    assert deadline_of_key(server, queue, "r") == Y2030_MS
    r = dq(server, "reschedule", queue, "--key", "r", "--deadline", str(Y2030_MS + 1), "--json")
    assert json.loads(r.stdout)["deadline"] == Y2030_MS + 1
    # relative: a delay on the server's clock
    before = time.time() * 1000
    r = dq(server, "reschedule", queue, "--key", "r", "--deadline", "+2h", "--json")
    after = time.time() * 1000
    deadline = json.loads(r.stdout)["deadline"]
    assert before + 7_200_000 - 1000 <= deadline <= after + 7_200_000 + 1000
    r = dq(server, "reschedule", queue, "--key", "r", "--delay-ms", "60000", "--json")
    assert before + 60_000 - 1000 <= json.loads(r.stdout)["deadline"] <= time.time() * 1000 + 61_000


#: flags every command that sets a deadline refuses before anything is sent, and why
REFUSED = [
    (("--deadline", "1764000000"), "looks like seconds since the epoch"),
    (("--deadline", "tomorrow"), "is not a time"),
    (("--deadline", "+1h", "--delay-ms", "5"), "not allowed with argument"),
]


def test_reschedule_refuses_what_put_refuses_and_changes_nothing(
    server: LiveServer, queue: str
) -> None:
    assert dq(server, "create", queue, "--dedup-window-ms", "3600000").returncode == 0
    r = dq(server, "put", queue, "x", "--deadline", str(Y2030_MS), "--key", "k")
    assert r.returncode == 0, r.stderr
    for given, said in REFUSED:
        for command in (("put", queue, "y"), ("reschedule", queue, "--key", "k")):
            r = dq(server, *command, *given)
            assert r.returncode == 2 and said in r.stderr, (command, given, r.stderr)
            assert "Traceback" not in r.stderr
    [item] = json.loads(dq(server, "browse", queue, "--json").stdout)["items"]
    assert item["deadline"] == Y2030_MS


def test_every_command_that_sets_a_deadline_describes_it_alike(server: LiveServer) -> None:
    def flags(command: str) -> str:
        r = dq(server, command, "--help")
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())  # argparse wraps at the terminal's width
        start = text.index("--delay-ms DELAY_MS due")  # the options, not the usage line
        return text[start : text.index("epoch", start) + len("epoch")]

    put = flags("put")
    assert "--deadline TIME due at TIME: ISO 8601 (2026-12-01T09:30, local time" in put
    assert flags("requeue") == put and flags("reschedule") == put
