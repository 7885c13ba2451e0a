"""Deadline Queue's Spark pipeline: the ``dq`` data source and helpers around it.

``register(spark)`` makes ``format("dq")`` available on a session; ``release(df, ...)``
and ``requeue(df, ...)`` acknowledge the rows a batch job read with ``dq`` and has
finished with. ``docs/spark.md`` is the user guide and specifies the protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dq.pipeline.errors import OptionError, PipelineError, SparkNotInstalled

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["OptionError", "PipelineError", "SparkNotInstalled", "register", "release", "requeue"]


def register(spark: SparkSession) -> None:
    """Register the ``dq`` data source on ``spark`` (idempotent); ``SparkNotInstalled``
    names the install command when the spark extra is missing."""
    from dq.pipeline.install import require_spark

    require_spark()
    from dq.pipeline.source import DqDataSource

    spark.dataSource.register(DqDataSource)


def _acknowledge(
    df: DataFrame,
    action: str,
    url: str,
    queue: str,
    consumer: str,
    token: str | None,
    extra: dict[str, str],
) -> None:
    # a dq read's ``deadline`` column is the old deadline: never a requeue target
    cols = ["seq", "delay_ms"] if action == "requeue" and "delay_ms" in df.columns else ["seq"]
    options = {"url": url, "queue": queue, "consumer": consumer, "action": action} | extra
    if token:
        options["token"] = token
    df.select(*cols).write.format("dq").mode("append").options(**options).save()


def release(
    df: DataFrame, url: str, queue: str, consumer: str = "spark", token: str | None = None
) -> None:
    """Acknowledge (release) the items behind ``df``'s rows: ``df`` must keep the ``seq``
    column of a ``dq`` read made with the same ``consumer``."""
    _acknowledge(df, "release", url, queue, consumer, token, {})


def requeue(
    df: DataFrame,
    url: str,
    queue: str,
    consumer: str = "spark",
    token: str | None = None,
    delay_ms: int = 0,
) -> None:
    """Give the items behind ``df``'s rows back to the queue after ``delay_ms``, or after
    a per-row ``delay_ms`` column when ``df`` has one (e.g. a backoff from ``dequeue_count``)."""
    _acknowledge(df, "requeue", url, queue, consumer, token, {"delayMs": str(delay_ms)})
