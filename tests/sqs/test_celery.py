"""Real Celery workers on kombu's SQS transport, with dq as the broker.

The server requires a token (the worker signs with it as its secret key). One worker
subprocess (solo pool) runs a task, a task Celery retries, and a long task during which
it is SIGKILLed; a second worker then gets that task again once its
visibility timeout (3 s) has run out, because the task was acknowledged late. On a FIFO
queue (``.fifo``, tasks sent with a ``MessageGroupId``), two workers run each group's
tasks one at a time and in order, and different groups at once.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.live import REPO, live_server
from tests.sqs.conftest import SERVER_ENV

pytestmark = pytest.mark.integration  # a live dq serve and a Celery worker process

TOKEN = "celery-secret-token"


def _wait_for(path: Path, timeout: float, worker: subprocess.Popen[bytes], log: Path) -> str:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if path.exists():
            return path.read_text()
        if worker.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"{path.name} did not appear; worker log:\n{log.read_text()[-3000:]}")


@pytest.fixture
def env(tmp_path: Path) -> Iterator[tuple[dict[str, str], Path]]:
    out = tmp_path / "out"
    out.mkdir()
    # with a token set, so the worker's requests are SigV4-signed with it and checked
    with live_server(tmp_path / "data", env={**SERVER_ENV, "DQ_TOKENS": TOKEN}) as server:
        host_port = server.url.removeprefix("http://")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "DQ_"))},
            "DQ_CELERY_BROKER": f"sqs://celery:{TOKEN}@{host_port}",
            "DQ_CELERY_QUEUE": "dq-celery",
            "DQ_CELERY_OUT": str(out),
            "PYTHONPATH": str(REPO / "tests" / "sqs"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        yield env, out


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "celery", "-A", "celery_tasks", "worker", "--pool=solo",
        "--concurrency=1", "--loglevel=info", "--without-heartbeat", "--without-gossip",
        "--without-mingle",
    ]  # fmt: skip
    with log.open("ab") as f:
        return subprocess.Popen(
            cmd, env=env, cwd=REPO / "tests" / "sqs", stdout=f, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _kill(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


@pytest.mark.timeout(120)
def test_celery_worker_round_trip_retry_and_crash(
    env: tuple[dict[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_env, out = env
    for k, v in worker_env.items():
        if k.startswith("DQ_CELERY"):
            monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(REPO / "tests" / "sqs"))
    sys.modules.pop("celery_tasks", None)
    import celery_tasks  # the producer: same app, same configuration

    log = tmp_path / "worker.log"
    first = _worker(worker_env, log)
    second = None
    try:
        celery_tasks.add.delay(2, 3)
        assert _wait_for(out / "add-2-3", 30, first, log) == "5"

        celery_tasks.flaky.delay("flaky")
        assert _wait_for(out / "flaky-done", 20, first, log) == "2"
        assert (out / "flaky-attempt-1").exists()

        celery_tasks.slow.delay("slow")
        pid = _wait_for(out / "slow-started", 20, first, log)
        os.killpg(first.pid, signal.SIGKILL)  # mid-task: never acknowledged
        first.wait(10)
        assert not (out / "slow-done").exists()
        killed_at = time.monotonic()
        second = _worker(worker_env, log)
        done_pid = _wait_for(out / "slow-done", 30, second, log)
        assert done_pid != pid and (out / "slow-restarted").exists()
        assert time.monotonic() - killed_at >= 1  # came back by its visibility timeout
        celery_tasks.app.close()
    finally:
        _kill(first)
        if second is not None:
            _kill(second)


def _ready(log: Path, worker: subprocess.Popen[bytes], timeout: float) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if log.exists() and " ready." in log.read_text():
            return
        if worker.poll() is not None:
            break
        time.sleep(0.05)
    raise AssertionError(f"the worker did not start; its log:\n{log.read_text()[-3000:]}")


@pytest.mark.timeout(120)
def test_celery_fifo_queue_runs_a_group_in_order(
    env: tuple[dict[str, str], Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker_env, out = env
    worker_env = {**worker_env, "DQ_CELERY_QUEUE": "dq-celery.fifo"}
    for k, v in worker_env.items():
        if k.startswith("DQ_CELERY"):
            monkeypatch.setenv(k, v)
    monkeypatch.syspath_prepend(str(REPO / "tests" / "sqs"))
    sys.modules.pop("celery_tasks", None)
    import celery_tasks

    logs = [tmp_path / "worker-1.log", tmp_path / "worker-2.log"]
    workers = [_worker(worker_env, log) for log in logs]
    try:
        for w, log in zip(workers, logs, strict=True):
            _ready(log, w, 30)
        steps = 4
        for group in ("A", "B"):  # a group's steps one after the other: a free worker
            for n in range(steps):  # would take A's next step if A were not held
                celery_tasks.ordered.apply_async((group, n), MessageGroupId=group)
        spans: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
        for group, group_spans in spans.items():
            for n in range(steps):
                start = float(_wait_for(out / f"start-{group}-{n}", 30, workers[0], logs[0]))
                end = float(_wait_for(out / f"end-{group}-{n}", 30, workers[0], logs[0]))
                group_spans.append((start, end))
        celery_tasks.app.close()
    finally:
        for w in workers:
            _kill(w)
    for group_spans in spans.values():  # in order, one at a time
        for (_, end), (next_start, _) in itertools.pairwise(group_spans):
            assert next_start >= end
    # the two workers ran the two groups side by side
    assert any(a0 < b1 and b0 < a1 for a0, a1 in spans["A"] for b0, b1 in spans["B"])
