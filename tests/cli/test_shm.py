"""``dq top`` and ``dq tail`` run as a user would, against ``dq serve --shm``.

One server for the module: its data directory gets the rings' discovery file; items go
in over HTTP (``dq put``) and through the submission ring; ``dq tail`` must print their
events and ``dq top`` their figures.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import httpx
import pytest

from dq.shm import subscriber

pytestmark = pytest.mark.integration  # runs dq as a process, against live servers

DQ = [sys.executable, "-m", "dq.cli.main"]
ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    data = tmp_path_factory.mktemp("rings") / "data"
    port = _free_port()
    env = {**os.environ, "DQ_SHM": "1", "DQ_FSYNC": "never"}
    proc = subprocess.Popen(
        [*DQ, "serve", "--data-dir", str(data), "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while not (data / "dq-rings.json").exists():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            assert time.monotonic() < give_up, "the server never served its rings"
            time.sleep(0.1)
        yield data, url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
    assert not (data / "dq-rings.json").exists()  # removed on shutdown


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DQ, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_tail_prints_every_event_of_the_queue(served: tuple[Path, str]) -> None:
    data, url = served
    tail = subprocess.Popen(
        [*DQ, "tail", "tailq", "--data-dir", str(data), "--count", "4", "--timeout", "60"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert tail.stdout is not None
        assert tail.stdout.readline().startswith("# tailing tailq")  # subscribed now
        put = run("put", "tailq", "one", "--url", url)
        assert put.returncode == 0, put.stderr
        done = subscriber.submitter(data).enqueue("tailq", b"two", timeout_s=30)
        out, err = tail.communicate(timeout=60)
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.communicate(timeout=10)
    assert tail.returncode == 0, err
    lines = [line.split() for line in out.splitlines()]
    kinds = [(fields[1], fields[2]) for fields in lines]
    assert kinds[0] == ("queue_created", "tailq")
    assert ("enqueued", "tailq") in kinds
    assert lines[-1][1:] == ["enqueued", "tailq", str(done.id)] or any(
        f[1:] == ["enqueued", "tailq", str(done.id)] for f in lines
    )
    assert len(lines) == 4
    for fields in lines:  # each line starts with when, as an ISO 8601 local time
        assert datetime.fromisoformat(fields[0]).tzinfo is not None, fields


def test_top_shows_the_queues(served: tuple[Path, str]) -> None:
    data, url = served
    sub = subscriber.submitter(data)
    for i in range(3):
        sub.enqueue("topq", b"%d" % i, timeout_s=30)
    with httpx.Client(base_url=url, timeout=10) as http:
        http.post(
            "/v1/queues/topq/dequeue", json={"count": 1, "lease_ms": 60_000}
        ).raise_for_status()
    give_up = time.monotonic() + 30
    while True:
        top = run("top", "--once", "--data-dir", str(data))
        assert top.returncode == 0, top.stderr
        row = next((line for line in top.stdout.splitlines() if "topq" in line), None)
        if row is not None:
            cells = row.replace("│", " ").split()
            if cells[1:5] == ["3", "2", "0", "1"]:  # pending, due, delayed, leased
                break
        assert time.monotonic() < give_up, top.stdout
        time.sleep(0.5)
    live = run("top", "--iterations", "2", "--interval", "0.2", "--data-dir", str(data))
    assert live.returncode == 0, live.stderr
    assert "topq" in live.stdout


def test_without_a_server_both_fail_clearly(tmp_path: Path) -> None:
    """Run where there is no ``./dq-data`` (outside the repository) without
    ``--data-dir``: the message names the missing directory and the flag, not a
    server setting; in a directory no server used, or one whose server is gone, it
    says so."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    for args in (["top", "--once"], ["tail", "q", "--count", "1"]):
        r = subprocess.run(
            [*DQ, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2
        assert r.stderr.splitlines() == [
            f"dq {args[0]}: no data directory dq-data: give the one the server was started "
            "with (--data-dir, DQ_DATA_DIR)"
        ]
        result = run(*args, "--data-dir", str(tmp_path))
        assert result.returncode == 2
        assert f"{tmp_path} is not a dq data directory (no server has used it)" in result.stderr
    (tmp_path / "LOCK").touch()
    result = run("top", "--once", "--data-dir", str(tmp_path))
    assert result.returncode == 2 and "no server runs on it, or it was started with --no-shm" in (
        result.stderr
    )
    assert "DQ_SHM=1" not in result.stderr


def test_top_fits_80_columns_with_whole_names(served: tuple[Path, str]) -> None:
    """On an 80-column terminal the queue column is as wide as the names (up to what is
    left), and how late the oldest due item is reads as a duration, not raw ms."""
    data, url = served
    name = "emails.welcome-v2"
    put = run("put", name, "late", "--deadline=-2m", "--url", url)
    assert put.returncode == 0, put.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")} | {"COLUMNS": "80"}
    give_up = time.monotonic() + 30
    while True:
        top = subprocess.run(
            [*DQ, "top", "--once", "--data-dir", str(data)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert top.returncode == 0, top.stderr
        row = next((line for line in top.stdout.splitlines() if name in line), None)
        if row is not None:
            break
        assert time.monotonic() < give_up, top.stdout
        time.sleep(0.5)
    assert all(len(line) <= 80 for line in top.stdout.splitlines()), top.stdout
    header = next(line for line in top.stdout.splitlines() if line.startswith("queue"))
    assert header.split() == [
        "queue", "pending", "due", "delayed", "leased", "enq/s", "rel/s", "exp/s", "late"
    ]  # fmt: skip
    cells = row.split()
    assert cells[0] == name and cells[1:3] == ["1", "1"], row
    assert re.fullmatch(r"2\.\d min", " ".join(cells[-2:])), row  # due two minutes ago
