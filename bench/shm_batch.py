"""Batches over the shared-memory command ring beside the same batches over HTTP.

Run from the repository root:  .venv/bin/python -m bench.shm_batch [--rounds 3] [--json]

Starts ``dq serve`` (shared memory on; once with ``--fsync always``, once with ``never``,
where the disk no longer hides the CPU) and drives it through the public ``Client`` from
this process, ``shm:///data-dir`` and ``http://…`` taking turns round by round, with
256-byte values:

- ``enqueue_many`` of 100 items, repeated: items/s;
- ``dequeue`` of 100, then ``release_many`` of them, until the queue is empty: items/s;
- the same consumer with the releases riding on the next ``dequeue`` (one request per
  100 items);
- single items, to check the one-item path did not pay for the batches: ``enqueue``, and
  ``dequeue`` of 1 + ``release``, ops/s.

Each figure is the median over the rounds, with the server process's CPU and this
process's CPU per item (from /proc and ``time.process_time``): on a shared, loaded machine
throughput swings with the neighbours, CPU per item much less. bench/NOTES.md
("Batches over the shared-memory ring") has the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.shm import cpu_seconds, dq_server

VALUE = b"v" * 256
BATCH = 100


def measure(pid: int, run: Callable[[], int]) -> dict[str, float]:
    """``run()`` returns how many items it handled; rate and CPU per item."""
    server0, client0, t0 = cpu_seconds(pid), time.process_time(), time.perf_counter()
    items = run()
    wall = time.perf_counter() - t0
    return {
        "items_s": items / wall,
        "server_us": (cpu_seconds(pid) - server0) / items * 1e6,
        "client_us": (time.process_time() - client0) / items * 1e6,
    }


def workloads(dq: Any, queue: str, batches: int, singles: int) -> dict[str, Callable[[], int]]:
    from dq.client import Release

    def enqueue_many() -> int:
        for _ in range(batches):
            dq.enqueue_many(queue, [VALUE] * BATCH)
        return batches * BATCH

    def fill() -> int:
        return enqueue_many()

    def dequeue_release() -> int:
        done = 0
        while items := dq.dequeue(queue, BATCH, 60_000):
            outcomes = dq.release_many(queue, items)
            assert all(o.ok for o in outcomes)
            done += len(items)
        return done

    def dequeue_riding() -> int:
        done, held = 0, list[Release]()
        while True:
            items = dq.dequeue(queue, BATCH, 60_000, release=held)
            assert all(o.ok for o in items.released)
            if not items:
                return done
            held = [Release(i.id, i.receipt) for i in items]
            done += len(items)

    def single_enqueue() -> int:
        for _ in range(singles):
            dq.enqueue(queue + "-1", VALUE)
        return singles

    def single_dequeue_release() -> int:
        done = 0
        while items := dq.dequeue(queue + "-1", 1, 60_000):
            dq.release(queue + "-1", items[0].id, items[0].receipt)
            done += 1
        return done

    return {
        "enqueue_many(100)": enqueue_many,
        "fill": fill,  # not measured: the next consumer's items
        "dequeue(100) + release_many": dequeue_release,
        "fill again": fill,
        "dequeue(100, release=previous)": dequeue_riding,
        "enqueue (single)": single_enqueue,
        "dequeue(1) + release": single_dequeue_release,
    }


def bench(rounds: int, batches: int, singles: int) -> dict[str, Any]:
    from dq.client import Client

    results: dict[str, Any] = {}
    for fsync in ("always", "never"):
        with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
            data = Path(tmp) / "data"
            with dq_server(data, fsync) as (url, pid):
                rows: dict[tuple[str, str], list[dict[str, float]]] = {}
                for r in range(rounds):
                    for transport, target in (("http", url), ("shm", f"shm://{data}")):
                        with Client(target) as dq:
                            dq.enqueue(f"warm-{transport}", VALUE)  # connect / attach, bind
                            queue = f"{transport}-{r}"
                            for name, run in workloads(dq, queue, batches, singles).items():
                                if name.startswith("fill"):
                                    run()
                                    continue
                                rows.setdefault((name, transport), []).append(measure(pid, run))
                results[fsync] = {
                    f"{name} | {transport}": {
                        k: statistics.median(m[k] for m in runs) for k in runs[0]
                    }
                    for (name, transport), runs in rows.items()
                }
                for key, row in results[fsync].items():
                    print(
                        f"fsync={fsync:6} {key:42} {row['items_s']:9.0f} items/s"
                        f"  server {row['server_us']:6.1f} us/item"
                        f"  client {row['client_us']:6.1f} us/item",
                        flush=True,
                    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=40, help="batches of 100 per figure")
    parser.add_argument("--singles", type=int, default=500, help="single items per figure")
    parser.add_argument("--json", action="store_true", help="print the results as JSON too")
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; load average at start: {os.getloadavg()}", flush=True)
    results = bench(args.rounds, args.batches, args.singles)
    print("load average at end:", os.getloadavg())
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
