"""The Celery app of tests/sqs/test_celery.py: tasks that leave marker files behind.

Configured from the environment (broker URL, queue, marker directory) so the worker
subprocess and the test's producer share one definition.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery import Celery, Task

app = Celery("celery_tasks")
app.conf.update(
    broker_url=os.environ.get("DQ_CELERY_BROKER", "sqs://celery:unused@127.0.0.1:8080"),
    broker_transport_options={
        "region": "us-east-1",
        "is_secure": False,
        "visibility_timeout": 3,
        "wait_time_seconds": 1,
        "polling_interval": 0.1,
    },
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("DQ_CELERY_QUEUE", "celery"),
    task_acks_late=True,
    worker_prefetch_multiplier=1,
    worker_enable_remote_control=False,
    worker_send_task_events=False,
)
OUT = Path(os.environ.get("DQ_CELERY_OUT", "."))


def mark(name: str, text: str = "") -> None:
    tmp = OUT / f".{name}.tmp"
    tmp.write_text(text)
    tmp.rename(OUT / name)


@app.task
def add(x: int, y: int) -> int:
    mark(f"add-{x}-{y}", str(x + y))
    return x + y


@app.task(bind=True, max_retries=3)
def flaky(self: Task, token: str) -> str:
    """Fails (and is retried by Celery) until its second attempt."""
    attempt = self.request.retries + 1
    mark(f"{token}-attempt-{attempt}")
    if attempt < 2:
        raise self.retry(countdown=1)
    mark(f"{token}-done", str(attempt))
    return token


@app.task
def slow(token: str) -> str:
    """Runs long the first time (the worker is killed meanwhile), briefly after."""
    first = not (OUT / f"{token}-started").exists()
    mark(f"{token}-started" if first else f"{token}-restarted", str(os.getpid()))
    if first:
        time.sleep(60)
    mark(f"{token}-done", str(os.getpid()))
    return token


@app.task
def ordered(group: str, n: int) -> int:
    """One step of a group's work, taking a while: its start and end are marked with the
    time, so the test can tell the order of a group's steps and what ran at once."""
    mark(f"start-{group}-{n}", repr(time.time()))
    time.sleep(0.3)
    mark(f"end-{group}-{n}", repr(time.time()))
    return n
