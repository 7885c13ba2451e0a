"""SQS endpoint benchmark: boto3 against ``dq serve``'s SQS API, beside the native client.

Run from the repository root:  .venv/bin/python -m bench.sqs [--seconds 3] [--threads 1]

Starts ``dq serve --fsync always`` and drives it from this process, for ``--seconds``
per phase, with ``--threads`` threads each holding its own client: boto3 (the SQS JSON
protocol at ``POST /``) and the project's ``dq.client.Client`` (``/v1``). Values are 256
bytes. Printed, messages per second for each API:

- send one (``SendMessage`` / ``enqueue``)
- send batches of 10 (``SendMessageBatch`` / ``enqueue_many``)
- receive one and delete it (``ReceiveMessage`` + ``DeleteMessage`` / ``dequeue`` + ``release``)
- receive 10 and delete them (``ReceiveMessage`` + ``DeleteMessageBatch`` / ``release_many``)

and the CPU time this process spent per step (one call, or a receive and its delete):
what the client library costs on its own, apart from the server.

The machine, the date and the load average before and after go with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from bench.servers import free_port, stop
from dq.client import Client

REPO = Path(__file__).resolve().parents[1]
VALUE = "v" * 256
BATCH = 10


def _start(data_dir: str, port: int, fsync: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", data_dir, "--port", str(port),
           "--fsync", fsync, "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("server did not come up")


def _sqs(url: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="unused",
        config=Config(retries={"max_attempts": 1}),
    )


def _run(threads: int, seconds: float, make: Callable[[int], Callable[[], int]]) -> float:
    """Messages per second of ``threads`` loops, each calling its own step repeatedly.

    Also records (in ``_cpu``) this process's CPU time per step: what the client
    library itself costs, apart from the server."""
    counts = [0] * threads
    steps_done = [0] * threads
    steps = [make(i) for i in range(threads)]
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        step, n, k = steps[i], 0, 0
        while time.monotonic() < stop:
            n += step()
            k += 1
        counts[i], steps_done[i] = n, k

    t0, cpu0 = time.monotonic(), time.process_time()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    _cpu.append((time.process_time() - cpu0) / max(1, sum(steps_done)))
    return sum(counts) / (time.monotonic() - t0)


#: client CPU seconds per step of each phase run, in order
_cpu: list[float] = []


def sqs_phases(url: str, queue: str, threads: int, seconds: float) -> dict[str, float]:
    clients = [_sqs(url) for _ in range(threads)]
    qurl = clients[0].create_queue(QueueName=queue)["QueueUrl"]
    entries = [{"Id": str(i), "MessageBody": VALUE} for i in range(BATCH)]

    def send(i: int) -> Callable[[], int]:
        c = clients[i]
        return lambda: (c.send_message(QueueUrl=qurl, MessageBody=VALUE), 1)[1]

    def send_batch(i: int) -> Callable[[], int]:
        c = clients[i]
        return lambda: len(c.send_message_batch(QueueUrl=qurl, Entries=entries)["Successful"])

    def recv_one(i: int) -> Callable[[], int]:
        c = clients[i]

        def step() -> int:
            got = c.receive_message(QueueUrl=qurl).get("Messages", [])
            for m in got:
                c.delete_message(QueueUrl=qurl, ReceiptHandle=m["ReceiptHandle"])
            return len(got)

        return step

    def recv_batch(i: int) -> Callable[[], int]:
        c = clients[i]

        def step() -> int:
            got = c.receive_message(QueueUrl=qurl, MaxNumberOfMessages=BATCH).get("Messages", [])
            if got:
                c.delete_message_batch(
                    QueueUrl=qurl,
                    Entries=[
                        {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]}
                        for n, m in enumerate(got)
                    ],
                )
            return len(got)

        return step

    return {
        "send": _run(threads, seconds, send),
        "send_batch": _run(threads, seconds, send_batch),
        "receive_delete": _run(threads, seconds, recv_one),
        "receive_delete_batch": _run(threads, seconds, recv_batch),
    }


def native_phases(url: str, queue: str, threads: int, seconds: float) -> dict[str, float]:
    clients = [Client(url) for _ in range(threads)]
    values = [VALUE] * BATCH

    def send(i: int) -> Callable[[], int]:
        c = clients[i]
        return lambda: (c.enqueue(queue, VALUE), 1)[1]

    def send_batch(i: int) -> Callable[[], int]:
        c = clients[i]
        return lambda: len(c.enqueue_many(queue, values))

    def recv_one(i: int) -> Callable[[], int]:
        c = clients[i]

        def step() -> int:
            got = c.dequeue(queue, 1)
            for item in got:
                c.release(queue, item.id, item.receipt)
            return len(got)

        return step

    def recv_batch(i: int) -> Callable[[], int]:
        c = clients[i]

        def step() -> int:
            got = c.dequeue(queue, BATCH)
            if got:
                c.release_many(queue, got)
            return len(got)

        return step

    try:
        return {
            "send": _run(threads, seconds, send),
            "send_batch": _run(threads, seconds, send_batch),
            "receive_delete": _run(threads, seconds, recv_one),
            "receive_delete_batch": _run(threads, seconds, recv_batch),
        }
    finally:
        for c in clients:
            c.close()


_ROWS = (
    ("send", "send one message"),
    ("send_batch", f"send batches of {BATCH}"),
    ("receive_delete", "receive one + delete it"),
    ("receive_delete_batch", f"receive {BATCH} + delete them (batch)"),
)


def _report(r: dict[str, Any]) -> str:
    lines = [
        f"machine: {r['machine']}, {r['cpus']} CPUs; {r['date']}; fsync {r['fsync']}; "
        f"{r['threads']} thread(s) x {r['seconds']} s per phase",
        f"load average before / after: {r['load_before']} / {r['load_after']}",
        "",
        "| phase | boto3 → SQS endpoint | dq Client → /v1 | SQS / native "
        "| client CPU per step, boto3 / Client |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, (key, label) in enumerate(_ROWS):
        s, n = r["sqs"][key], r["native"][key]
        cs, cn = r["client_cpu_ms"]["sqs"][i], r["client_cpu_ms"]["native"][i]
        lines.append(
            f"| {label} | {s:,.0f} msg/s | {n:,.0f} msg/s | {s / n:.2f} | {cs:.2f} / {cn:.2f} ms |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per phase")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--fsync", default="always", choices=["always", "interval", "never"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data = tempfile.mkdtemp(prefix="dq-bench-sqs-")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start(data, port, args.fsync)
    try:
        before = "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())
        result: dict[str, Any] = {
            "sqs": sqs_phases(url, "bench-sqs", args.threads, args.seconds),
            "native": native_phases(url, "bench-native", args.threads, args.seconds),
        }
        phases = len(_ROWS)
        result["client_cpu_ms"] = {
            "sqs": [c * 1000 for c in _cpu[:phases]],
            "native": [c * 1000 for c in _cpu[phases:]],
        }
        result.update(
            machine=f"{platform.system()} {platform.machine()}",
            cpus=os.cpu_count(),
            date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            fsync=args.fsync,
            threads=args.threads,
            seconds=args.seconds,
            load_before=before,
            load_after="{:.2f} {:.2f} {:.2f}".format(*os.getloadavg()),
        )
    finally:
        stop(proc)
        shutil.rmtree(data, ignore_errors=True)
    print(json.dumps(result, indent=1) if args.json else _report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
