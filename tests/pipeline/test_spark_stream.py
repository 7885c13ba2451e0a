"""Streaming reads and the worked job with real local Spark against a real server."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dq.client import Client
from dq.client.groups import ConsumerClient
from dq.pipeline.jobs import event_counts
from tests.server.live import REPO, LiveServer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def stream(spark: SparkSession, url: str, queue: str, consumer: str, **opts: Any) -> DataFrame:
    r = spark.readStream.format("dq").option("url", url).option("queue", queue)
    r = r.option("consumer", consumer)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(df: DataFrame, out: Path, checkpoint: Path) -> list[int]:
    """Run to completion; returns the input rows of each micro-batch."""
    q = (
        df.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    assert q.awaitTermination(180), "the availableNow query did not terminate"
    assert q.exception() is None
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def assert_drained(url: str, queue: str, consumer: str) -> None:
    with Client(url) as dq:
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased) == (0, 0)
    with ConsumerClient(url, queue, consumer) as c:
        info = c.info()
        assert info is not None and info.in_flight == 0


def test_stream_twice_on_one_checkpoint(
    spark: SparkSession, server: LiveServer, queue: str, tmp_path: Path
) -> None:
    out, ck = tmp_path / "out", tmp_path / "ck"
    with Client(server.url) as dq:
        first = [e.id for e in dq.enqueue_many(queue, [f"a{i}".encode() for i in range(300)])]

        def query() -> DataFrame:
            df = stream(spark, server.url, queue, "twice", maxItemsPerTrigger=100, minPartitions=2)
            return df.selectExpr("id", "cast(value as string) AS v", "dequeue_count", "seq")

        batches = run_available_now(query(), out, ck)
        assert batches == [100, 100, 100]
        assert_drained(server.url, queue, "twice")  # the last batch is acknowledged too
        second = [e.id for e in dq.enqueue_many(queue, [f"b{i}".encode() for i in range(250)])]
        assert run_available_now(query(), out, ck) == [100, 100, 50]
        assert_drained(server.url, queue, "twice")
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.id for r in rows) == sorted(first + second)  # every item, once
    assert {r.dequeue_count for r in rows} == {1}


def test_task_failing_mid_batch_loses_nothing(
    spark: SparkSession, server: LiveServer, queue: str, tmp_path: Path
) -> None:
    """``local[2,3]`` retries the failed task; it re-reads the same log range."""
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    with Client(server.url) as dq:
        ids = [e.id for e in dq.enqueue_many(queue, [f"t{i}".encode() for i in range(400)])]

    def fail_once(v: bytes) -> str:
        ctx = TaskContext.get()
        if bytes(v) == b"t150" and ctx is not None and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure in the middle of a micro-batch")
        return bytes(v).decode()

    fail = udf(fail_once, "string", useArrow=False)
    df = stream(spark, server.url, queue, "flaky", maxItemsPerTrigger=200, minPartitions=2)
    df = df.select("id", fail(col("value")).alias("v"), "dequeue_count")
    assert run_available_now(df, tmp_path / "out", tmp_path / "ck") == [200, 200]
    rows = spark.read.parquet(str(tmp_path / "out")).collect()
    assert sorted(r.id for r in rows) == sorted(ids)  # nothing lost, nothing doubled
    # a re-read is the same delivery; an item delivered again would show dequeue_count 2
    assert {r.dequeue_count for r in rows} == {1}
    assert_drained(server.url, queue, "flaky")


def events(n: int) -> list[bytes]:
    kinds = ("view", "click", "buy")
    base = 1_800_000_000_000
    out = [
        json.dumps(
            {"event": kinds[i % 3], "user": f"u{i % 7}", "ts": base + i * 1000, "amount": 1.5}
        ).encode()
        for i in range(n)
    ]
    return [*out, b"not json", b"\xff\xfe"]


def check_event_counts(spark: SparkSession, out: Path, n: int) -> None:
    from pyspark.sql import functions as F

    agg = spark.read.parquet(str(out))
    per_event = {
        r.event: (r.events, r.amount)
        for r in agg.groupBy("event")
        .agg(F.sum("events").alias("events"), F.sum("amount").alias("amount"))
        .collect()
    }
    assert per_event == {
        "view": (n // 3, 1.5 * (n // 3)),
        "click": (n // 3, 1.5 * (n // 3)),
        "buy": (n // 3, 1.5 * (n // 3)),
        "_malformed": (2, 0.0),
    }


def test_event_counts_job(
    spark: SparkSession, server: LiveServer, queue: str, tmp_path: Path
) -> None:
    n = 300
    with Client(server.url) as dq:
        dq.enqueue_many(queue, events(n))
    args = event_counts.build_parser().parse_args(
        [
            "--url", server.url, "--queue", queue, "--out", str(tmp_path / "out"),
            "--checkpoint", str(tmp_path / "ck"), "--max-items-per-trigger", "120",
        ]
    )  # fmt: skip
    q = event_counts.start(spark, args)
    assert q.awaitTermination(180)
    assert q.exception() is None
    assert len([p for p in q.recentProgress if p["numInputRows"]]) == 3
    check_event_counts(spark, tmp_path / "out", n)
    assert_drained(server.url, queue, "event-counts")


def producer(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.pipeline.jobs.produce_events", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.mark.slow
def test_the_documented_walk_produces_and_counts_events(
    spark: SparkSession, server: LiveServer, queue: str, tmp_path: Path
) -> None:
    """docs/spark.md's worked job as a user runs it: the sample producer fills the queue,
    ``python -m ...event_counts`` counts it, and PySpark starts without a warning about
    the pandas it was given."""
    made = producer("--url", server.url, "--queue", queue, "--count", "500", "--malformed", "3")
    assert made.returncode == 0, made.stderr
    # "enqueued 503 values to Q at URL: 301 view, 124 click, 50 add_to_cart, 25 purchase; 3 malformed"
    said = dict((k, int(n)) for n, k in re.findall(r"(\d+) (\w+)", made.stdout.split(": ", 1)[1]))
    assert said.pop("malformed") == 3 and sum(said.values()) == 500, made.stdout
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    cmd = [
        sys.executable, "-m", "dq.pipeline.jobs.event_counts", "--master", "local[2]",
        "--url", server.url, "--queue", queue, "--out", str(tmp_path / "out"),
        "--checkpoint", str(tmp_path / "ck"),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=240)
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, stderr[-3000:]
    assert "does not yet fully support pandas" not in stderr
    from pyspark.sql import functions as F

    agg = spark.read.parquet(str(tmp_path / "out")).groupBy("event").agg(F.sum("events"))
    counted = {r[0]: r[1] for r in agg.collect()}
    assert counted == {**{k: n for k, n in said.items() if n}, "_malformed": 3}
    assert_drained(server.url, queue, "event-counts")
