"""Client CPU per request: what ``Client`` and ``AsyncClient`` cost the calling process.

Run from the repository root:  .venv/bin/python -m bench.client_cpu [--n 3000] [--runs 3]

Starts ``dq serve --fsync never`` (the server's cost is not measured here) and, in this
process, times N single-item enqueues (256-byte values), N dequeue+release pairs and N
items through the consumer helper (``Client.consumer(...).run``: each release rides on
the next dequeue) over one keep-alive connection, reading this process's CPU time
(``time.process_time``): with ``Client``, with ``AsyncClient``, with ``Client`` over the
shared-memory ring (``shm://``, same server), and, for comparison, the standard
library's ``http.client`` sending the same JSON and parsing the answer with ``json``.
Prints µs of client CPU per request (median of ``--runs``), the machine and its load
average: the machine may be shared, so compare figures of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.servers import free_port, stop
from dq.client import AsyncClient, Client

REPO = Path(__file__).resolve().parents[1]
VALUE = b"v" * 256


@contextlib.contextmanager
def _server(data_dir: Path) -> Iterator[str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    cmd = [
        sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(data_dir),
        "--port", str(port), "--fsync", "never", "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dq serve exited with {proc.returncode}")
            try:
                with Client(url, retries=0, timeout=1) as c:
                    c.health()
                break
            except Exception:
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        stop(proc)


def _per_call_us(n: int, call: Callable[[], object]) -> float:
    call()  # warm: connection, caches
    c0 = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - c0) / n * 1e6


def _sync(url: str, n: int) -> dict[str, float]:
    with Client(url) as dq:
        dq.put_queue("cpu")
        enqueue = _per_call_us(n, lambda: dq.enqueue("cpu", VALUE))

        def take() -> None:
            for item in dq.dequeue("cpu", count=1):
                dq.release("cpu", item.id, item.receipt)

        pair = _per_call_us(n, take)
        for _ in range(n + 1):
            dq.enqueue("cpu", VALUE)
        c0 = time.process_time()  # the consumer helper: one request per item
        stats = dq.consumer("cpu", wait_ms=0).run(lambda item: None, max_items=n)
        helper = (time.process_time() - c0) / n * 1e6
        assert stats.released == n, stats
    return {
        "enqueue": enqueue,
        "dequeue+release (per request)": pair / 2,
        "consumer helper (per item)": helper,
    }


def _async(url: str, n: int) -> dict[str, float]:
    async def run() -> dict[str, float]:
        async with AsyncClient(url) as dq:
            await dq.put_queue("cpu")
            await dq.enqueue("cpu", VALUE)
            c0 = time.process_time()
            for _ in range(n):
                await dq.enqueue("cpu", VALUE)
            enqueue = (time.process_time() - c0) / n * 1e6
            c0 = time.process_time()
            for _ in range(n):
                for item in await dq.dequeue("cpu", count=1):
                    await dq.release("cpu", item.id, item.receipt)
            pair = (time.process_time() - c0) / n * 1e6
        return {"enqueue": enqueue, "dequeue+release (per request)": pair / 2}

    return asyncio.run(run())


def _floor(url: str, n: int) -> dict[str, float]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port))
    value = VALUE.decode()

    def enqueue() -> None:
        body = json.dumps({"items": [{"value": value, "encoding": "utf-8"}]})
        conn.request("POST", "/v1/queues/cpu/items", body, {"Content-Type": "application/json"})
        json.loads(conn.getresponse().read())

    try:
        return {"enqueue": _per_call_us(n, enqueue)}
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=3000, help="requests per measurement")
    parser.add_argument("--runs", type=int, default=3, help="medians of this many runs")
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, _server(Path(tmp) / "data") as url:
        shm_url = f"shm://{Path(tmp) / 'data'}"
        for _ in range(args.runs):  # interleaved: a slow period hits every client alike
            for name, measure in (("Client", _sync), ("AsyncClient", _async),
                                  ("Client(shm://)", lambda _, n: _sync(shm_url, n)),
                                  ("http.client + json", _floor)):  # fmt: skip
                for op, us in measure(url, args.n).items():
                    results.setdefault(f"{name}: {op}", []).append(us)
    load = os.getloadavg()
    print(f"# bench/client_cpu.py  {time.strftime('%Y-%m-%d %H:%M %Z')}  {platform.node()}")
    print(f"# {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"load average at the end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")  # fmt: skip
    print(f"# n={args.n} per measurement, median of {args.runs} runs, µs of client CPU per request")
    for label, values in results.items():
        print(
            f"{label:45s} {statistics.median(values):7.0f} µs  [{min(values):.0f}-{max(values):.0f}]"
        )


if __name__ == "__main__":
    main()
