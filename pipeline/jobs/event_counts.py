"""Worked job: JSON events from a queue → per-minute counts → Parquet → acknowledged.

Each item's value is a JSON event ``{"event": str, "user": str, "ts": ms, "amount": num}``.
Every micro-batch is aggregated by event type and minute and written as Parquet to
``OUT/batch_id=N``, overwriting that directory, so a batch Spark replays after a crash
rewrites the same files instead of adding duplicates. The ``dq`` source acknowledges a
batch's items only once Spark has committed it: a crash before that leaves them leased
to the consumer, and the next run with the same checkpoint reads them again. Values
that are not such JSON are counted under the event ``_malformed``.

    python -m dq.pipeline.jobs.event_counts --url http://127.0.0.1:8080 --queue events \\
        --out /data/event-counts --checkpoint /data/event-counts-ck

Needs the spark extra (``make spark``) and Java 17 or later: without them it says so and
exits 2. ``python -m dq.pipeline.jobs.produce_events`` fills a queue with sample events.

Runs unchanged on ``local[*]`` (the default when not launched by ``spark-submit``) and on
a cluster (``spark-submit --master ... pipeline/jobs/event_counts.py ...``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dq.pipeline.errors import SparkNotInstalled
from dq.pipeline.install import require_java, require_spark

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["EVENT_SCHEMA", "aggregate", "build_parser", "main", "start"]

log = logging.getLogger(__name__)

EVENT_SCHEMA = "event string, user string, ts long, amount double"
MALFORMED = "_malformed"


def aggregate(items: DataFrame) -> DataFrame:
    """Rows of a ``dq`` read → one row per (event, minute): events, users, amount."""
    from pyspark.sql import functions as F

    e = F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e")
    parsed = items.select(e)
    return parsed.groupBy(
        F.coalesce(F.col("e.event"), F.lit(MALFORMED)).alias("event"),
        (F.floor(F.col("e.ts") / 60_000) * 60_000).cast("long").alias("minute"),
    ).agg(
        F.count(F.lit(1)).alias("events"),
        F.countDistinct("e.user").alias("users"),
        F.coalesce(F.sum("e.amount"), F.lit(0.0)).alias("amount"),
    )


def start(spark: SparkSession, args: argparse.Namespace) -> StreamingQuery:
    """Start the streaming query described by ``args`` on ``spark`` (dq registered)."""
    reader = (
        spark.readStream.format("dq")
        .option("url", args.url)
        .option("queue", args.queue)
        .option("consumer", args.consumer)
        .option("maxItemsPerTrigger", str(args.max_items_per_trigger))
        .option("minPartitions", str(args.partitions))
        .option("leaseMs", str(args.lease_ms))
    )
    if args.token:
        reader = reader.option("token", args.token)
    out = args.out.rstrip("/")

    def write_batch(batch: DataFrame, batch_id: int) -> None:
        aggregate(batch).coalesce(1).write.mode("overwrite").parquet(f"{out}/batch_id={batch_id}")

    writer = reader.load().writeStream.foreachBatch(write_batch)
    writer = writer.option("checkpointLocation", args.checkpoint).queryName("event_counts")
    if args.trigger == "available-now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.interval} seconds")
    return writer.start()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="event_counts", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("DQ_URL", "http://127.0.0.1:8080"))
    p.add_argument("--queue", default="events")
    p.add_argument("--consumer", default="event-counts")
    p.add_argument("--token", default=os.environ.get("DQ_TOKEN"))
    p.add_argument("--out", required=True, help="Parquet output directory")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--max-items-per-trigger", type=int, default=10_000)
    p.add_argument("--partitions", type=int, default=2, help="minimum partitions per batch")
    p.add_argument("--lease-ms", type=int, default=300_000)
    p.add_argument(
        "--trigger",
        choices=("available-now", "continuous"),
        default="available-now",
        help="drain what is due and stop (default), or keep consuming",
    )
    p.add_argument("--interval", type=int, default=5, help="seconds between continuous batches")
    p.add_argument("--master", help="Spark master (default: local[*] outside spark-submit)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        require_spark()
        require_java()
    except SparkNotInstalled as exc:
        print(f"event_counts: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Executors must run this interpreter (with this project installed), not PATH's python3.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from dq import pipeline

    builder = SparkSession.builder.appName("dq-event-counts")
    if args.master:
        builder = builder.master(args.master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = builder.master("local[*]")
    spark = builder.getOrCreate()
    pipeline.register(spark)
    query = start(spark, args)
    query.awaitTermination()
    progress = query.recentProgress
    log.info(
        "event_counts done: %d batches, %d items",
        len(progress),
        sum(p["numInputRows"] for p in progress),
    )
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
