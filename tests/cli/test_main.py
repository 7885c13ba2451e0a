"""``dq`` as a subprocess: client commands against a live server, and ``dq serve`` itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.client.scripted import Answer, scripted
from tests.server.live import REPO, LiveServer, free_port

# integration: runs dq as a process, against live servers
pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def dq(
    server: LiveServer, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.cli.main", *args, "--url", server.url]
    return subprocess.run(
        cmd,
        cwd=REPO,
        input=stdin.decode() if stdin else None,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_put_get_ack_json(server: LiveServer, queue: str) -> None:
    put = dq(server, "put", queue, "one", "two", "--json")
    assert put.returncode == 0, put.stderr
    ids = [e["id"] for e in json.loads(put.stdout)]
    got = dq(server, "get", queue, "-n", "5", "--json")
    items = json.loads(got.stdout)
    assert [i["id"] for i in items] == ids and [i["value"] for i in items] == ["one", "two"]
    ack = dq(server, "ack", queue, str(items[0]["id"]), items[0]["receipt"])
    assert ack.returncode == 0 and f"released {ids[0]}" in ack.stdout
    again = dq(server, "ack", queue, str(items[0]["id"]), items[0]["receipt"])
    assert again.returncode == 1 and "stale_receipt" in again.stderr
    rq = dq(
        server,
        "requeue",
        queue,
        str(items[1]["id"]),
        items[1]["receipt"],
        "--delay-ms",
        "60000",
        "--json",
    )
    assert rq.returncode == 0 and json.loads(rq.stdout)["ok"] is True
    stats = json.loads(dq(server, "stats", queue, "--json").stdout)
    assert (
        stats["name"] == queue and stats["stats"]["pending"] == 1 and stats["stats"]["delayed"] == 1
    )


def test_human_output(server: LiveServer, queue: str) -> None:
    assert dq(server, "put", queue, stdin=b"from stdin").returncode == 0
    got = dq(server, "get", queue, "--ack")
    assert got.returncode == 0 and "from stdin" in got.stdout
    listing = dq(server, "queues")
    assert listing.returncode == 0 and queue in listing.stdout
    assert "pending" in dq(server, "stats", queue).stdout
    missing = dq(server, "stats", "no-such-queue")
    assert missing.returncode == 1 and "queue_not_found" in missing.stderr


def test_get_on_a_queue_nobody_created_says_so(server: LiveServer, queue: str) -> None:
    """``dq get`` on a misspelled (or not yet created) queue says so on stderr, once,
    instead of "(no due items)"; with --json too, beside the empty list."""
    note = (
        f"dq get: queue {queue}-typo does not exist (yet): nothing is due until a producer "
        "creates it (is the name right? `dq queues` lists them)\n"
    )
    got = dq(server, "get", queue + "-typo", "--wait-ms", "300")
    assert (got.returncode, got.stdout, got.stderr) == (0, "", note)
    as_json = dq(server, "get", queue + "-typo", "--json")
    assert (as_json.returncode, json.loads(as_json.stdout), as_json.stderr) == (0, [], note)
    assert dq(server, "put", queue + "-typo", "now").returncode == 0
    emptied = dq(server, "get", queue + "-typo", "--ack")
    assert emptied.returncode == 0 and "does not exist" not in emptied.stderr
    idle = dq(server, "get", queue + "-typo")
    assert (idle.returncode, idle.stderr) == (0, "(no due items)\n")


def test_values_print_as_stored_whatever_they_look_like(server: LiveServer, queue: str) -> None:
    """A table cell is text, not rich markup: a value like ``[/x]`` made ``dq get``
    fail after leasing (with ``--ack``: after releasing) what it never printed."""
    values = ["[/oops]", "[bold]B[/bold]", ":smile:"]
    assert dq(server, "put", queue, *values).returncode == 0
    browse = dq(server, "browse", queue, "--values")
    got = dq(server, "get", queue, "-n", "3", "--ack")
    for r in (browse, got):
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert all(v in r.stdout for v in values), r.stdout


def test_get_ack_releases_nothing_it_could_not_write_out(server: LiveServer, queue: str) -> None:
    """``dq get --ack | reader``: a reader that is gone (a closed pipe) gets the items
    back, rather than having them released unseen."""
    dq(server, "put", queue, "kept")
    cmd = [sys.executable, "-m", "dq.cli.main", "get", queue, "--ack", "--json"]
    with subprocess.Popen([*cmd, "--url", server.url], cwd=REPO, stdout=subprocess.PIPE) as p:
        assert p.stdout is not None
        p.stdout.close()  # the reader exits before reading anything
        p.wait(60)
    info = json.loads(dq(server, "stats", queue, "--json").stdout)["stats"]
    assert (info["pending"], info["leased"]) == (1, 1)  # leased, not released: it comes back


def test_get_ack_says_which_items_it_could_not_release() -> None:
    """A release refused (the lease ran out first) is reported and the exit status is
    1: the item will be delivered again, so a script must not take it as done."""
    item = {
        "id": 1,
        "receipt": "r.1.1",
        "value": "x",
        "encoding": "utf-8",
        "deadline": 1,
        "stats": {"enqueue_time": 1, "requeue_time": 0, "dequeue_count": 1},
        "lease_expires": 2,
    }
    stale = {"id": 1, "ok": False, "error": "stale_receipt", "message": "that delivery is over"}
    script = [Answer(200, {"items": [item]}), Answer(200, {"results": [stale]})]
    with scripted(*script) as fake:
        cmd = [sys.executable, "-m", "dq.cli.main", "get", "q", "--ack", "--url", fake.url]
        got = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert got.returncode == 1, got.stdout
    assert "item 1 not released: stale_receipt" in got.stderr


def test_serve_drains_long_polls_on_sigterm(tmp_path: Path) -> None:
    server = LiveServer(tmp_path / "data", fsync="always").start()
    try:
        httpx.put(server.url + "/v1/queues/q", json={}, timeout=10).raise_for_status()
        with httpx.Client(timeout=30) as http:
            result: dict[str, object] = {}

            def poll() -> None:
                r = http.post(server.url + "/v1/queues/q/dequeue", json={"wait_ms": 20_000})
                result["status"], result["body"] = r.status_code, r.json()

            t = threading.Thread(target=poll)
            t.start()
            time.sleep(0.5)
            t0 = time.monotonic()
            assert server.terminate(timeout=30) == 0
            t.join(30)
        assert result == {"status": 200, "body": {"items": []}}
        assert time.monotonic() - t0 < 15  # drained, not waited out
    finally:
        server.kill()
    # the data directory is closed cleanly: a new server opens it at once
    again = LiveServer(tmp_path / "data").start()
    try:
        assert httpx.get(again.url + "/v1/queues/q").status_code == 200
    finally:
        again.terminate()


def test_serve_rejects_bad_settings(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "dq.cli.main",
        "serve",
        "--data-dir",
        str(tmp_path),
        "--max-batch",
        "0",
    ]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "max_batch" in r.stderr
    # 99999 would be served on 34463 (modulo 65536) while the log said 99999
    cmd[-2:] = ["--port", "99999"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "port must be at most 65535" in r.stderr


def test_serve_refuses_replication_without_fsync_always(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(tmp_path)]
    cmd += ["--etcd", "http://127.0.0.1:2379", "--fsync", "interval"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "fsync=always" in r.stderr, r.stderr


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--min-insync", "0"], "min_insync and leader_ttl_s must be at least 1"),
        (["--leader-ttl-s", "0"], "min_insync and leader_ttl_s must be at least 1"),
        (["--commit-timeout-ms", "0"], "commit_timeout_ms must be positive"),
        (["--replica-window-bytes", "1000"], "replica_window_bytes at least 1 MiB"),
    ],
)
def test_serve_takes_the_replication_settings_as_flags(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(tmp_path)]
    cmd += ["--etcd", "http://127.0.0.1:2379", *flags]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and said in r.stderr, r.stderr


def test_no_server_is_said_in_one_line_with_what_to_do() -> None:
    """A refused connection is one line naming the URL and the way to point elsewhere,
    not the transport's account of every try; the same through ``DQ_URL``."""
    url = f"http://127.0.0.1:{free_port()}"
    r = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", "queues", "--url", url],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1
    assert r.stderr == f"dq queues: no dq server at {url} — is it running? set --url or DQ_URL\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")} | {"DQ_URL": url}
    r = subprocess.run(
        [sys.executable, "-m", "dq.cli.main", "put", "q", "x"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.splitlines() == [
        f"dq put: no dq server at {url} — is it running? set --url or DQ_URL"
    ]


def test_a_url_with_a_path_says_the_path_is_the_problem(server: LiveServer, queue: str) -> None:
    def at(url: str, *args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "dq.cli.main", *args, "--url", url]
        return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)

    r = at(server.url + "/v1", "put", queue, "x")
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [
        f"dq put: {server.url}/v1: give the server's address without the API's path /v1 "
        f"(the commands add it): --url {server.url} or DQ_URL={server.url}"
    ]
    r = at(server.url + "/dq/", "stats", queue)
    assert r.returncode == 1
    assert f"{server.url}/dq answered 404 not_found: no dq API under the path /dq" in r.stderr
    assert httpx.get(f"{server.url}/v1/queues/{queue}", timeout=10).status_code == 404


def test_serve_on_a_port_in_use_says_so_before_opening_anything(tmp_path: Path) -> None:
    """One line and exit 1, with the data directory untouched: not uvicorn's
    ``[Errno 98]`` (exit 3) after the engine opened and "Application startup complete"."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(tmp_path / "d")]
        r = subprocess.run(
            [*cmd, "--port", str(port)], cwd=REPO, capture_output=True, text=True, timeout=60
        )
    assert r.returncode == 1, r.stderr
    assert r.stderr.splitlines() == [
        f"dq serve: port {port} is in use (on 127.0.0.1): stop what listens there, or give "
        "another with --port (DQ_PORT)"
    ]
    assert not (tmp_path / "d").exists()


def test_put_lines_makes_one_item_per_line(server: LiveServer, queue: str) -> None:
    """``dq put q < file`` stores the whole file as one item, as ``--help`` says;
    ``--lines`` makes one item per line (line endings off, empty lines skipped)."""
    r = dq(server, "put", queue, "--lines", "--json", stdin=b"one\ntwo\r\n\nthree")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)) == 3
    got = json.loads(dq(server, "get", queue, "-n", "10", "--ack", "--json").stdout)
    assert [i["value"] for i in got] == ["one", "two", "three"]
    r = dq(server, "put", queue, stdin=b"a\nb\n")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 1
    got = json.loads(dq(server, "get", queue, "-n", "10", "--ack", "--json").stdout)
    assert [i["value"] for i in got] == ["a\nb\n"]
    r = dq(server, "put", queue, "x", "--lines")
    assert r.returncode == 2 and "--lines reads stdin" in r.stderr
    help_ = " ".join(dq(server, "put", "--help").stdout.split())
    assert "all of stdin as one item" in help_ and "--lines" in help_
    assert "one item per line of stdin" in help_
