"""The operator commands as a user runs them: ``dq`` subprocesses against a live server,
and ``dq backup``/``dq serve``/``dq verify`` on data directories that are locked or missing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dq.client import Client, QueueConfig
from dq.storage import Engine, NewItem
from tests.server.live import REPO, LiveServer, free_port, live_server

# integration: runs dq as a process, against live servers
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.cli.main", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


def dq(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    return run(*args, "--url", server.url)


def test_help_and_version_list_every_command() -> None:
    out = run("--help").stdout
    for command in [
        "serve",
        "put",
        "get",
        "ack",
        "requeue",
        "queues",
        "stats",
        "create",
        "delete",
        "pause",
        "resume",
        "peek",
        "browse",
        "redrive",
        "purge",
        "backup",
        "inspect",
        "verify",
    ]:
        assert f"    {command} " in out, command
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("dq ")


def test_create_pause_resume_peek_browse_purge_delete(server: LiveServer, queue: str) -> None:
    r = dq(server, "create", queue, "--max-deliveries", "3", "--dedup-window-ms", "60000")
    assert r.returncode == 0, r.stderr
    assert f"dead letters to {queue}.dlq" in r.stdout and "60000 ms" in r.stdout
    r = dq(server, "put", queue, "a", "b", "--key", "k1", "--key", "k2")
    assert r.returncode == 0, r.stderr
    first = int(r.stdout.split()[0])
    r = dq(server, "put", queue, "a", "--key", "k1")
    assert r.stdout.split("\t")[0] == str(first) and "duplicate" in r.stdout
    r = dq(server, "pause", queue)
    assert r.returncode == 0 and r.stdout.startswith(f"paused {queue}")
    shown = dq(server, "stats", queue).stdout  # the table says why nothing is handed out
    assert re.search(r"paused\s+│\s+yes, since \d{4}-", shown), shown
    assert re.search(r"keys remembered\s+│\s+1\.0 min", shown), shown
    assert json.loads(dq(server, "get", queue, "--json").stdout) == []
    r = dq(server, "resume", queue)
    assert r.returncode == 0 and r.stdout.startswith(f"resumed {queue}")
    r = dq(server, "peek", queue, str(first), "--json")
    assert json.loads(r.stdout)["state"] == "due" and json.loads(r.stdout)["value"] == "a"
    r = dq(server, "browse", queue, "--limit", "1", "--values")
    assert r.returncode == 0 and f"dq browse {queue} --limit 1 --values --after " in r.stdout
    cursor = r.stdout.strip().split("--after ")[-1]
    r = dq(server, "browse", queue, "--after", cursor, "--json")
    assert [i["id"] for i in json.loads(r.stdout)["items"]] == [first + 1]
    dq(server, "put", queue + "x", "y")
    r = dq(server, "browse", queue + "x", "--after", cursor)
    assert r.returncode == 1 and "bad_cursor" in r.stderr and "Traceback" not in r.stderr
    r = dq(server, "purge", queue)
    assert r.returncode == 2 and "--yes" in r.stderr
    r = dq(server, "purge", queue, "--yes")
    assert r.returncode == 0 and r.stdout.strip() == f"purged 2 items from {queue}"
    r = dq(server, "peek", queue, "999")
    assert r.returncode == 1 and "item_not_found" in r.stderr
    r = dq(server, "delete", queue, "--yes")
    assert r.returncode == 0 and r.stdout.strip() == f"deleted queue {queue}"


def test_counts_agree_with_their_nouns(server: LiveServer, queue: str) -> None:
    """One item is "1 item", never "1 items", in every line the operator commands print."""
    dq(server, "put", queue, "only")
    r = dq(server, "pause", queue)
    assert r.stdout.strip() == f"paused {queue} (1 item pending; writes go on)"
    r = dq(server, "resume", queue)
    assert r.stdout.strip() == f"resumed {queue} (1 item due)"
    r = dq(server, "purge", queue, "--yes")
    assert r.stdout.strip() == f"purged 1 item from {queue}"
    r = dq(server, "pause", queue)
    assert r.stdout.strip() == f"paused {queue} (0 items pending; writes go on)"


def test_a_queue_name_with_a_slash_touches_no_other_queue(server: LiveServer, queue: str) -> None:
    dq(server, "put", queue, "kept")
    r = dq(server, "delete", f"{queue}/items", "--yes")  # the server would purge `queue`
    assert r.returncode == 1 and "invalid_queue_name" in r.stderr, r.stdout
    r = dq(server, "stats", "")
    assert r.returncode == 1 and "invalid_queue_name" in r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads(dq(server, "stats", queue, "--json").stdout)["stats"]["pending"] == 1


def test_redrive_from_the_command_line(server: LiveServer, queue: str) -> None:
    dq(server, "put", queue, "x")
    r = dq(server, "redrive", queue)
    assert r.returncode == 1 and "not_a_dead_letter_queue" in r.stderr
    r = dq(server, "redrive", queue, "--to", queue + "-b")
    assert r.returncode == 0 and r.stdout.strip() == f"moved 1 item from {queue} to {queue}-b"
    r = dq(server, "redrive", queue + "-b", "--to", queue, "--id", "999")
    assert r.returncode == 1 and "item 999: item_not_found" in r.stderr


def test_json_output_of_purge_delete_and_redrive(server: LiveServer, queue: str) -> None:
    """``--json`` is one JSON document for every command, and the exit status does not
    depend on the output format."""
    dq(server, "put", queue, "a", "b")
    r = dq(server, "purge", queue, "--yes", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"purged": 2}
    r = dq(server, "delete", queue, "--yes", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == {"deleted": queue}
    dq(server, "put", queue, "x")
    r = dq(server, "redrive", queue, "--to", queue + "-b", "--id", "999", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["failed"][0]["error"] == "item_not_found"


def test_the_next_page_command_keeps_the_state_filter(server: LiveServer, queue: str) -> None:
    dq(server, "put", queue, "a", "b", "c")
    dq(server, "get", queue)  # item 1 is leased: a "due" page must not show it
    r = dq(server, "browse", queue, "--state", "due", "--limit", "1")
    assert r.returncode == 0, r.stderr
    more = r.stdout.strip().splitlines()[-1]
    assert more.startswith(f"more: dq browse {queue} --state due --limit 1 --after ")
    r = run(*more.removeprefix("more: dq ").split(), "--url", server.url, "--json")
    assert [(i["id"], i["state"]) for i in json.loads(r.stdout)["items"]] == [(3, "due")]


def test_backup_of_a_stopped_data_directory_and_clear_errors(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Engine.open(data) as engine:
        engine.enqueue("q", [NewItem(b"kept", key="k")])
        engine.pause("q")
        locked = run("backup", str(tmp_path / "b0"), "--data-dir", str(data))
        assert locked.returncode == 1 and "in use by another process" in locked.stderr
        assert "Traceback" not in locked.stderr
        serve = run("serve", "--data-dir", str(data), "--port", "1")
        assert serve.returncode == 1 and "in use by another process" in serve.stderr
    missing = run("backup", str(tmp_path / "b1"), "--data-dir", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no such data directory" in missing.stderr
    assert run("verify", str(tmp_path / "nope")).returncode == 1
    r = run("backup", str(tmp_path / "copy"), "--data-dir", str(data))
    assert r.returncode == 0 and "backup written to" in r.stdout, r.stderr
    assert run("verify", str(tmp_path / "copy")).returncode == 0
    with Engine.open(tmp_path / "copy") as restored:
        assert restored.stats("q").paused
        again = restored.enqueue("q", [NewItem(b"other", key="k")])
        assert again[0].duplicate
        restored.resume("q")
        assert [d.value for d in restored.dequeue("q", 5)] == [b"kept"]


def test_serve_with_a_damaged_epoch_file_says_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "replica.json").write_text('{"epoch": "x"')
    serve = run("serve", "--data-dir", str(data), "--port", "1", "--etcd", "http://127.0.0.1:1")
    assert serve.returncode == 1, serve.stderr
    assert "replica.json" in serve.stderr and "restore it, or delete it" in serve.stderr
    assert "Traceback" not in serve.stderr
    assert (data / "replica.json").read_text() == '{"epoch": "x"'  # left as it was


def test_stats_shows_what_an_operator_reads_first(server: LiveServer, queue: str) -> None:
    """Dead letters, expired leases, rates and the oldest due item's age are in the
    table; the engine's internals only with ``--all`` (and ``--json`` has everything)."""
    dq(server, "create", queue, "--max-deliveries", "1")
    dq(server, "put", queue, "dies")
    with httpx.Client(base_url=server.url, timeout=10) as http:
        http.post(f"/v1/queues/{queue}/dequeue", json={"lease_ms": 100}).raise_for_status()
        give_up = time.monotonic() + 30
        while http.get(f"/v1/queues/{queue}").json()["stats"]["dead_lettered"] == 0:
            # the lease runs out; the next delivery would be its second: it dies instead
            assert time.monotonic() < give_up
            time.sleep(0.2)
            http.post(f"/v1/queues/{queue}/dequeue", json={}).raise_for_status()
        dq(server, "put", queue, "waits")
        http.post(f"/v1/queues/{queue}/dequeue", json={}).raise_for_status()
    r = dq(server, "stats", queue)
    assert r.returncode == 0, r.stderr
    for row in (
        r"dead-lettered\s+│\s+1 ",
        r"lease expired\s+│\s+1 ",
        r"enqueued/s\s+│\s+0\.0[1-9] ",  # items per second over the last minute
        r"leased\s+│\s+1 ",
        rf"dead letters to\s+│\s+{re.escape(queue)}\.dlq ",
        r"oldest lease\s+│\s+\d+(\.\d)? (ms|s) ",
    ):
        assert re.search(row, r.stdout), (row, r.stdout)
    internals = ("freeze_failures", "memseg_entries", "rotation_failures", "segments")
    assert not any(name in r.stdout for name in internals), r.stdout
    everything = dq(server, "stats", queue, "--all").stdout
    assert all(name in everything for name in internals), everything
    raw = json.loads(dq(server, "stats", queue, "--json").stdout)["stats"]
    assert raw["dead_lettered"] == 1 and "memseg_entries" in raw["extra"]
    listing = dq(server, "queues").stdout
    # pending, due, delayed, leased, dead-lettered
    assert re.search(rf"{re.escape(queue)}\s+│\s+1\s+│\s+0\s+│\s+0\s+│\s+1\s+│\s+1\s", listing)
    assert "segments" not in listing and "segments" in dq(server, "queues", "--all").stdout


def test_get_on_a_paused_queue_says_it_is_paused(server: LiveServer, queue: str) -> None:
    dq(server, "put", queue, "waiting")
    dq(server, "pause", queue)
    said = f"dq get: queue {queue} is paused: it hands nothing out until `dq resume {queue}` (1 item due)"
    r = dq(server, "get", queue)
    assert r.returncode == 0 and r.stderr.splitlines() == [said], r.stderr
    assert "no due items" not in r.stderr
    r = dq(server, "get", queue, "--json")
    assert json.loads(r.stdout) == [] and r.stderr.splitlines() == [said]
    dq(server, "resume", queue)
    r = dq(server, "get", queue, "--ack")
    assert r.returncode == 0 and "waiting" in r.stdout and "paused" not in r.stderr
    r = dq(server, "get", queue)
    assert r.stderr.strip() == "(no due items)"  # running and empty: as before


def test_peek_of_a_dead_lettered_item_says_where_it_went(server: LiveServer, queue: str) -> None:
    """Dead-lettering gives the item a new id in the dead-letter queue: ``dq peek`` of
    the old id says so, with the command that shows it."""
    with Client(server.url) as client:
        client.put_queue(queue, QueueConfig(default_lease_ms=100, max_deliveries=1))
        old_id = client.enqueue(queue, b"poison")
        client.dequeue(queue)
        time.sleep(0.3)  # the lease runs out; the next dequeue moves it to the DLQ
        client.dequeue(queue)
        give_up = time.monotonic() + 5
        while client.queue(queue).stats.dead_lettered == 0:
            assert time.monotonic() < give_up, "the item was not dead-lettered"
            time.sleep(0.05)
        (dead,) = client.browse(f"{queue}.dlq").items
    r = dq(server, "peek", queue, str(old_id))
    assert r.returncode == 0, r.stderr
    line = f"moved to {queue}.dlq as item {dead.id}: dq peek {queue}.dlq {dead.id}"
    assert line in r.stdout, r.stdout
    r = dq(server, "peek", queue, str(old_id), "--json")
    assert json.loads(r.stdout)["moved_to"] == {"queue": f"{queue}.dlq", "id": dead.id}


def test_serve_refuses_a_backup_dir_that_does_not_exist(tmp_path: Path) -> None:
    """Found at start, before anything is opened or served, flag or variable alike; the
    first backup would otherwise be the first to hear of it."""
    port = free_port()
    data = tmp_path / "data"
    missing = tmp_path / "backups"
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(data)]
    cmd += ["--port", str(port)]
    r = subprocess.run(
        [*cmd, "--backup-dir", str(missing)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        f"dq serve: --backup-dir {missing}: no such directory (create it, or leave "
        "--backup-dir out)"
    ]
    assert not data.exists()  # nothing opened
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    (tmp_path / "file").write_text("")
    r = subprocess.run(
        cmd, cwd=REPO, env=env | {"DQ_BACKUP_DIR": str(tmp_path / "file")},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and "not a directory" in r.stderr, r.stderr
    missing.mkdir()
    with live_server(data, env={"DQ_BACKUP_DIR": str(missing)}) as server:
        r = dq(server, "backup", "nightly")
        assert r.returncode == 0 and f"backup written to {missing}" in r.stdout, r.stderr


def test_deleting_a_dead_letter_queue_in_use_needs_force(tmp_path: Path) -> None:
    """A queue another queue sends its dead letters to is not deleted by ``--yes``
    alone (its dead letters would go, and the next would create it again): the command
    says whose it is and that ``--force`` deletes it; every delete is in the server's
    log, a forced one as a warning."""
    with live_server(tmp_path / "data", args=["--log-level", "info"]) as server:
        dq(server, "create", "orders", "--max-deliveries", "3")
        dq(server, "put", "orders.dlq", "dead letter")
        r = dq(server, "delete", "orders.dlq", "--yes")
        assert r.returncode == 1, r.stdout
        assert r.stderr.splitlines() == [
            "dq delete: queue orders.dlq is the dead-letter queue of orders: its dead letters "
            "would be lost and the next would create it again; give orders another "
            "dead_letter_queue first, or delete it with force (--force)"
        ]
        r = dq(server, "stats", "orders.dlq", "--json")
        assert json.loads(r.stdout)["stats"]["pending"] == 1  # still there
        r = dq(server, "delete", "orders.dlq", "--yes", "--force")
        assert r.returncode == 0 and r.stdout.strip() == "deleted queue orders.dlq", r.stderr
        r = dq(server, "delete", "orders", "--yes")
        assert r.returncode == 0, r.stderr
        log = server.log()
    assert (
        "WARNING dq.storage.engine: queue orders.dlq deleted, though it is the dead-letter "
        "queue of orders" in log
    )
    assert "INFO dq.storage.engine: queue orders deleted" in log
