"""``dq top`` and ``dq tail`` run as a user would, against ``dq serve --shm``.

One server for the module: its data directory gets the rings' discovery file; items go
in over HTTP (``dq put``) and through the submission ring; ``dq tail`` must print their
events and ``dq top`` their figures.
"""

from __future__ import annotations

import os
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
            if cells[1:4] == ["3", "2", "1"]:  # pending, due, leased
                break
        assert time.monotonic() < give_up, top.stdout
        time.sleep(0.5)
    live = run("top", "--iterations", "2", "--interval", "0.2", "--data-dir", str(data))
    assert live.returncode == 0, live.stderr
    assert "topq" in live.stdout


def test_without_a_server_both_fail_clearly(tmp_path: Path) -> None:
    for args in (["top", "--once"], ["tail", "q", "--count", "1"]):
        result = run(*args, "--data-dir", str(tmp_path))
        assert result.returncode == 2
        assert "no rings served" in result.stderr
