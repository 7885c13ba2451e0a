"""Batch reads, acknowledgement and writes with real local Spark against a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from dq import pipeline
from dq.client import Client
from dq.client.groups import ConsumerClient
from tests.server.live import LiveServer, free_port
from tests.server.threaded import threaded_server

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark


def read(spark: SparkSession, url: str, queue: str, consumer: str, **opts: Any) -> DataFrame:
    r = spark.read.format("dq").option("url", url).option("queue", queue)
    r = r.option("consumer", consumer)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_batch_read_10000_items_over_4_partitions(
    spark: SparkSession, server: LiveServer, queue: str
) -> None:
    with Client(server.url) as dq:
        ids: list[int] = []
        for k in range(10):
            batch = [f"item-{k * 1000 + i}".encode() for i in range(1000)]
            ids += [e.id for e in dq.enqueue_many(queue, batch)]
        df = read(spark, server.url, queue, "batch", maxItems=10_000, numPartitions=4)
        assert df.rdd.getNumPartitions() == 4
        rows = df.select("id", "value", "dequeue_count", "seq").collect()
        assert sorted(r.id for r in rows) == sorted(ids)  # each item exactly once
        assert {bytes(r.value) for r in rows} == {f"item-{i}".encode() for i in range(10_000)}
        assert {r.dequeue_count for r in rows} == {1}
        assert dq.queue(queue).stats.leased == 10_000  # nothing released before we say so
        # evaluating the DataFrame again sees the same, still un-acknowledged items
        assert df.count() == 10_000
        pipeline.release(df, server.url, queue, "batch")
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased) == (0, 0)
    with ConsumerClient(server.url, queue, "batch") as c:
        info = c.info()
        assert info is not None and (info.in_flight, info.first_unacked) == (0, 10_000)


def test_requeue_rows_back_with_a_delay(
    spark: SparkSession, server: LiveServer, queue: str
) -> None:
    with Client(server.url) as dq:
        dq.enqueue_many(queue, [f"r{i}".encode() for i in range(30)])
        df = read(spark, server.url, queue, "rq", maxItems=30, numPartitions=2)
        pipeline.requeue(df.where("value < X'7231'"), server.url, queue, "rq", delay_ms=3_600_000)
        pipeline.release(df, server.url, queue, "rq")
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased, stats.delayed) == (1, 0, 1)  # only b"r0" is < b"r1"


def test_failing_job_redelivers_with_dequeue_count(
    spark: SparkSession, server: LiveServer, queue: str
) -> None:
    """A batch job that fails for good leaves its items un-acknowledged; given back, they
    come again, and the second delivery says so in ``dequeue_count``."""
    from py4j.protocol import Py4JJavaError
    from pyspark import TaskContext
    from pyspark.errors import PySparkException

    with Client(server.url) as dq:
        ids = [e.id for e in dq.enqueue_many(queue, [f"f{i}".encode() for i in range(200)])]
    df = read(spark, server.url, queue, "failing", maxItems=200, numPartitions=2)

    def always_fails(rows: Any) -> Any:
        ctx = TaskContext.get()
        for n, row in enumerate(rows):
            if ctx is not None and ctx.partitionId() == 1 and n == 50:
                raise RuntimeError("injected failure")
            yield row

    with pytest.raises((Py4JJavaError, PySparkException)):
        df.rdd.mapPartitions(always_fails).count()
    with ConsumerClient(server.url, queue, "failing") as c:
        assert c.delete()  # the job is abandoned: give its items back
    again = read(spark, server.url, queue, "retry", maxItems=500, numPartitions=2).collect()
    assert sorted(r.id for r in again) == sorted(ids)
    assert {r.dequeue_count for r in again} == {2}
    with ConsumerClient(server.url, queue, "retry") as c:
        assert c.commit(10**9).released == 200


def test_write_round_trip(spark: SparkSession, server: LiveServer, queue: str) -> None:
    rows: list[tuple[str, int | None, int | None]] = [(f"w{i}", None, None) for i in range(300)]
    rows.append(("later", None, 3_600_000))
    rows.append(("past", 1_000, None))
    df = spark.createDataFrame(rows, "value string, deadline long, delay_ms long").repartition(3)
    df.write.format("dq").mode("append").option("url", server.url).option("queue", queue).option(
        "batchSize", "64"
    ).save()
    with Client(server.url) as dq:
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.delayed) == (302, 1)
    back = read(spark, server.url, queue, "rt", maxItems=1000, numPartitions=2)
    got = sorted(bytes(r.value).decode() for r in back.collect())
    assert got == sorted([f"w{i}" for i in range(300)] + ["past"])
    pipeline.release(back, server.url, queue, "rt")


def test_writer_retry_replays_its_batches(server: LiveServer, queue: str) -> None:
    """What a retried task does: the same writer (same write id) writes the same partition
    again; every batch key is known to the server, so nothing is enqueued twice."""
    from pyspark.sql import Row

    from dq.pipeline.options import WriteOptions
    from dq.pipeline.writer import Writer

    opts = WriteOptions.parse({"url": server.url, "queue": queue, "batchSize": "7"})
    schema = spark_schema()
    writer = Writer(opts, schema)
    rows = [Row(value=f"p{i}", delay_ms=None) for i in range(50)]

    def dies_after(n: int) -> Iterator[Any]:
        yield from rows[:n]
        raise RuntimeError("executor lost")

    with pytest.raises(RuntimeError):
        writer.write(dies_after(30))  # attempt 0 sent 4 full batches (28 rows), then died
    again = writer.write(iter(rows))  # attempt 1 writes the whole partition
    assert (again.rows, again.replayed_batches) == (50, 4)
    with Client(server.url) as dq:
        assert dq.queue(queue).stats.pending == 50
    other = Writer(opts, schema).write(iter(rows))  # a new write job is a new write
    assert other.replayed_batches == 0


def spark_schema() -> Any:
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    return StructType([StructField("value", StringType()), StructField("delay_ms", LongType())])


def test_retried_write_task_does_not_enqueue_twice(
    spark: SparkSession, server: LiveServer, queue: str
) -> None:
    from pyspark import TaskContext
    from pyspark.sql.functions import col, udf

    n = 2000

    def fail_once(v: str) -> str:
        ctx = TaskContext.get()
        if v == f"x{n - 1}" and ctx is not None and ctx.attemptNumber() == 0:
            raise RuntimeError("injected failure at the end of the partition")
        return v

    df = spark.createDataFrame([(f"x{i}",) for i in range(n)], "value string").coalesce(1)
    fail_once_udf = udf(fail_once, "string", useArrow=False)
    df.select(fail_once_udf(col("value")).alias("value")).write.format("dq").mode("append").option(
        "url", server.url
    ).option("queue", queue).option("batchSize", "50").save()
    with Client(server.url) as dq:
        assert dq.queue(queue).stats.pending == n


def test_server_keeps_short_leases_alive(
    spark: SparkSession, server: LiveServer, queue: str
) -> None:
    """Leases shorter than the job survive: the server extends them until acked
    (``leaseMs`` below the server's floor of 5 s gets the floor)."""
    import time

    with Client(server.url) as dq:
        dq.enqueue_many(queue, [f"k{i}".encode() for i in range(100)])
        df = read(spark, server.url, queue, "short", maxItems=100, numPartitions=2, leaseMs=1000)
        assert df.count() == 100
        time.sleep(7)  # longer than the (5 s) lease
        assert dq.queue(queue).stats.leased == 100
        rows = df.select("dequeue_count").collect()  # re-read: the same deliveries
        assert [r.dequeue_count for r in rows] == [1] * 100
        pipeline.release(df, server.url, queue, "short")
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased) == (0, 0)
    with ConsumerClient(server.url, queue, "short") as c:
        info = c.info()
        assert info is not None and (info.lost, info.in_flight) == (0, 0)


def test_a_replicated_deployment_through_its_follower(
    spark: SparkSession, server: LiveServer, queue: str, tmp_path: Path
) -> None:
    """``url`` lists a dead node and a follower: the driver and every executor find the
    leader (``server``) on their own, reading and releasing there."""
    with threaded_server(tmp_path / "follower", fsync="never", shm=False) as follower:
        follower.engine.set_role(False, server.url)
        urls = f"http://127.0.0.1:{free_port()},{follower.url}"
        with Client(server.url) as dq:
            ids = [e.id for e in dq.enqueue_many(queue, [f"f{i}".encode() for i in range(40)])]
            df = read(spark, urls, queue, "via-follower", maxItems=40, numPartitions=2)
            assert sorted(r.id for r in df.select("id").collect()) == ids
            pipeline.release(df, urls, queue, "via-follower")
            stats = dq.queue(queue).stats
            assert (stats.pending, stats.leased) == (0, 0)
        assert follower.engine.list_queues() == []  # nothing was done on the follower
