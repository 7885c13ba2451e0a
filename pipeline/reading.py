"""Rows, partitions and the executor side of reading a range of a consumer's log.

A partition is a range ``[start, end)`` of sequence numbers in the consumer's delivery
log (``docs/spark.md``). Reading it is replayable: the server keeps every entry, with its
value, until the driver acknowledges it, so a retried task reads the same rows again.
Entries that are gone (acknowledged, lease lost, server restarted) are skipped: their
items are done or pending again, never lost.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from client.consumers import ConsumerClient
from pipeline.options import Connection

__all__ = ["SCHEMA", "LogRange", "read_range", "split"]

log = logging.getLogger(__name__)

SCHEMA = (
    "id long, receipt string, value binary, deadline long, enqueue_time long, "
    "requeue_time long, dequeue_count int, seq long"
)

Row = tuple[int, str, bytes, int, int, int, int, int]


@dataclass
class LogRange(InputPartition):  # type: ignore[misc]
    """One Spark partition: log sequences ``start <= seq < end``."""

    start: int
    end: int

    def __post_init__(self) -> None:
        InputPartition.__init__(self, (self.start, self.end))


def split(start: int, end: int, parts: int) -> list[LogRange]:
    """Cut ``[start, end)`` into at most ``parts`` contiguous, nearly equal ranges."""
    size = end - start
    if size <= 0:
        return []
    parts = max(1, min(parts, size))
    step, extra = divmod(size, parts)
    out, lo = [], start
    for i in range(parts):
        hi = lo + step + (1 if i < extra else 0)
        out.append(LogRange(lo, hi))
        lo = hi
    return out


def read_range(conn: Connection, part: LogRange, page: int) -> Iterator[Row]:
    """Yield the rows of ``part``, reading the log ``page`` sequences per request."""
    with ConsumerClient(
        conn.url, conn.queue, conn.consumer, token=conn.token, timeout=conn.timeout_s
    ) as client:
        for lo in range(part.start, part.end, page):
            hi = min(lo + page, part.end)
            result = client.read(lo, hi)
            if not result.found:
                log.warning(
                    "consumer %s/%s unknown to the server (restarted?): range [%d, %d) skipped; "
                    "its items are pending again",
                    conn.queue,
                    conn.consumer,
                    lo,
                    part.end,
                )
                return
            for it in result.items:
                yield (
                    it.id,
                    it.receipt,
                    it.value,
                    it.deadline,
                    it.enqueue_time,
                    it.requeue_time,
                    it.dequeue_count,
                    it.seq,
                )
