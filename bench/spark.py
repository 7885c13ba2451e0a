"""Spark benchmark (docs/spark.md): items/s pulled and released through the ``dq`` source.

Run from the repository root:  .venv/bin/python -m bench.spark [--items 20000] [--runs 3]

Starts one ``dq serve`` (``--fsync always`` unless told otherwise) and, against it, in
the same run:

- a single Python consumer with the client: ``dequeue(count=1000)`` then
  ``release_many`` until the queue is empty;
- a Spark streaming query (``trigger(availableNow=True)``, ``noop`` sink) reading the
  same number of items with 1, 2 and 4 partitions per micro-batch; the time runs from
  ``start()`` to termination, so it includes planning, the executors' reads and the
  commits that release every item.

Each figure is the median of ``--runs`` runs (min and max shown); every run uses a
fresh queue filled beforehand (fill time not counted). Spark runs on ``local[4]`` so
four partitions can be in flight at once on however many cores there are; one warm-up
run with four partitions first starts the JVM and the Python workers Spark then reuses.
"""

from __future__ import annotations

import argparse
import contextlib
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
from typing import Any

import httpx

from bench.servers import free_port, stop

REPO = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def dq_server(data_dir: Path, fsync: str) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(data_dir),
        "--port", str(port), "--fsync", fsync, "--log-level", "warning",
    ]  # fmt: skip
    log = (data_dir.parent / "server.log").open("ab")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        give_up = time.monotonic() + 60
        while True:
            if proc.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError("dq serve did not come up")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.1)
        yield url
    finally:
        stop(proc)
        log.close()


def fill(url: str, queue: str, items: int, size: int) -> None:
    from dq.client import Client

    value = b"x" * size
    with Client(url) as dq:
        for lo in range(0, items, 1000):
            dq.enqueue_many(queue, [value] * min(1000, items - lo))


def python_consumer(url: str, queue: str, items: int) -> float:
    """Seconds for one client to dequeue and release ``items`` items, 1,000 at a time."""
    from dq.client import Client

    done = 0
    with Client(url) as dq:
        t0 = time.perf_counter()
        while done < items:
            got = dq.dequeue(queue, count=1000, lease_ms=60_000)
            if not got:
                raise RuntimeError(f"queue ran dry after {done} of {items}")
            dq.release_many(queue, got)
            done += len(got)
        return time.perf_counter() - t0


def spark_run(
    spark: Any, url: str, queue: str, items: int, per_trigger: int, partitions: int, ck: Path
) -> float:
    """Seconds for an availableNow query with ``partitions`` per batch to drain ``items``."""
    df = (
        spark.readStream.format("dq")
        .option("url", url)
        .option("queue", queue)
        .option("consumer", "bench")
        .option("maxItemsPerTrigger", str(per_trigger))
        .option("minPartitions", str(partitions))
        .option("itemsPerPartition", str(10**6))
        .load()
    )
    t0 = time.perf_counter()
    q = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
    )
    query = q.start()
    if not query.awaitTermination(600):
        query.stop()
        raise RuntimeError("Spark run did not finish in 600 s")
    elapsed = time.perf_counter() - t0
    seen = sum(p["numInputRows"] for p in query.recentProgress)
    if seen != items:
        raise RuntimeError(f"Spark saw {seen} of {items} items")
    return elapsed


def measure(runs: int, once: Callable[[int], float], items: int) -> dict[str, float]:
    rates = [items / once(i) for i in range(runs)]
    return {"median": statistics.median(rates), "min": min(rates), "max": max(rates)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--items", type=int, default=20_000)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--per-trigger", type=int, default=20_000, help="maxItemsPerTrigger")
    ap.add_argument("--fsync", default="always", choices=("always", "interval", "never"))
    ap.add_argument("--json", action="store_true", help="print one JSON object only")
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dq import pipeline

    results: dict[str, Any] = {
        "items": args.items,
        "value_bytes": args.value_bytes,
        "fsync": args.fsync,
        "runs": args.runs,
        "per_trigger": args.per_trigger,
        "machine": f"{os.cpu_count()} CPU, {platform.machine()}, Python {platform.python_version()}",
    }
    with tempfile.TemporaryDirectory(prefix="dq-bench-spark-") as tmp:
        root = Path(tmp)
        with dq_server(root / "data", args.fsync) as url:
            spark = (
                SparkSession.builder.master("local[4]")
                .appName("dq-bench")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "4")
                .getOrCreate()
            )
            spark.sparkContext.setLogLevel("ERROR")
            pipeline.register(spark)
            counter = iter(range(10**6))

            def fresh() -> str:
                q = f"bench-{next(counter)}"
                fill(url, q, args.items, args.value_bytes)
                return q

            def py_once(_: int) -> float:
                return python_consumer(url, fresh(), args.items)

            def spark_once(partitions: int) -> Callable[[int], float]:
                def once(_: int) -> float:
                    q = fresh()
                    return spark_run(
                        spark, url, q, args.items, args.per_trigger, partitions, root / f"ck-{q}"
                    )

                return once

            spark_once(4)(0)  # warm-up: JVM, planner, and four Python workers to reuse
            results["python_consumer"] = measure(args.runs, py_once, args.items)
            for p in (1, 2, 4):
                results[f"spark_{p}_partitions"] = measure(args.runs, spark_once(p), args.items)
            spark.stop()
    base = results["python_consumer"]["median"]
    results["ratio_4_partitions_vs_python"] = results["spark_4_partitions"]["median"] / base
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"{results['machine']}; {args.items} items of {args.value_bytes} B; fsync={args.fsync}")
    print(f"{'reader':<24}{'median items/s':>16}{'min':>10}{'max':>10}")
    for key in (
        "python_consumer",
        "spark_1_partitions",
        "spark_2_partitions",
        "spark_4_partitions",
    ):
        r = results[key]
        print(f"{key:<24}{r['median']:>16,.0f}{r['min']:>10,.0f}{r['max']:>10,.0f}")
    print(f"4 partitions / single Python consumer: {results['ratio_4_partitions_vs_python']:.2f}x")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
