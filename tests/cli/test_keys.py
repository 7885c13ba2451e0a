"""dq cancel, dq reschedule, dq peek --key, dq put --key --replace and dq fail, run as
users run them against a live server (cli/keys.py; the rules are the server's)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server.live import REPO, LiveServer

# integration: runs dq as a process, against a live server
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def dq(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.cli.main", *args, "--url", server.url]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def test_items_by_key_and_fail_from_the_command_line(server: LiveServer, queue: str) -> None:
    """A debounced digest put with --replace, a payment timeout rescheduled and then
    cancelled by key, a leased item left alone, and a failed item's reason shown."""
    assert dq(server, "create", queue, "--dedup-window-ms", "3600000").returncode == 0
    later = ("--delay-ms", "600000", "--key", "d", "--replace")
    first = dq(server, "put", queue, "digest 1", *later)
    assert first.returncode == 0 and "replaced" not in first.stdout, first.stderr
    item_id = first.stdout.split("\t")[0]
    again = dq(server, "put", queue, "digest 2", *later)
    assert again.stdout.split("\t")[0] == item_id and again.stdout.strip().endswith("replaced")
    shown = json.loads(dq(server, "peek", queue, "--key", "d", "--json").stdout)
    assert (str(shown["id"]), shown["value"], shown["state"]) == (item_id, "digest 2", "delayed")
    r = dq(server, "put", queue, "x", "--replace")
    assert r.returncode == 2 and "give --key" in r.stderr

    r = dq(server, "reschedule", queue, "--key", "d", "--delay-ms", "0", "--value", "now")
    assert r.returncode == 0 and r.stdout.startswith(f"item {item_id} of {queue} (key d) due")
    [got] = json.loads(dq(server, "get", queue, "--json").stdout)
    assert (str(got["id"]), got["value"]) == (item_id, "now")
    r = dq(server, "cancel", queue, "--key", "d")
    assert r.returncode == 1 and "item_leased" in r.stderr and "Traceback" not in r.stderr
    r = dq(server, "fail", queue, item_id, got["receipt"], "SMTPError: 451 try later")
    assert r.returncode == 0 and r.stdout.startswith(f"failed {item_id} (due again "), r.stderr
    shown = json.loads(dq(server, "peek", queue, "--key", "d", "--json").stdout)
    assert [e["error"] for e in shown["errors"]] == ["SMTPError: 451 try later"]
    r = dq(server, "peek", queue, "--key", "d")
    assert "failed on delivery 1" in r.stdout and "SMTPError: 451 try later" in r.stdout

    r = dq(server, "cancel", queue, "--key", "d")
    assert r.stdout.strip() == f"cancelled item {item_id} of {queue} (key d)", r.stderr
    r = dq(server, "cancel", queue, "--key", "d")
    assert r.returncode == 1 and "key_not_found" in r.stderr
    assert dq(server, "peek", queue).returncode == 2  # neither id nor key
    assert json.loads(dq(server, "get", queue, "--json").stdout) == []
