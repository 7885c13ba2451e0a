"""Rows, partitions and the executor side of reading a range of a consumer's log.

A partition is a range ``[start, end)`` of sequence numbers in the consumer's delivery
log (``docs/spark.md``). Reading it is replayable: the server keeps every entry, with its
value, until the driver acknowledges it, so a retried task reads the same rows again.
Entries that are gone (acknowledged, lease lost, server restarted) are skipped: their
items are done or pending again, never lost. Ranges travel column by column and become
Arrow record batches without a Python loop over values (Spark takes those directly).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from dq.client.groups import ConsumerClient, PullRange, ReadColumns
from dq.pipeline.options import Connection

__all__ = [
    "ARROW_SCHEMA",
    "SCHEMA",
    "LogRange",
    "note_missing_queue",
    "read_range",
    "split",
    "to_arrow",
]

log = logging.getLogger(__name__)

#: Queues this process has said are missing (once each).
_told_missing: set[str] = set()


def note_missing_queue(queue: str, got: PullRange) -> None:
    """Say once, in the log, that the queue a job reads does not exist: it reads 0 items
    until a producer creates it, and a misspelled name would read 0 forever in silence."""
    if not got.queue_exists and queue not in _told_missing:
        _told_missing.add(queue)
        log.warning(
            "dq queue %s does not exist (yet): nothing to read until a producer creates it "
            "(is the name right?)",
            queue,
        )


SCHEMA = (
    "id long, receipt string, value binary, deadline long, enqueue_time long, "
    "requeue_time long, dequeue_count int, seq long"
)


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


ARROW_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("receipt", pa.string()),
        ("value", pa.binary()),
        ("deadline", pa.int64()),
        ("enqueue_time", pa.int64()),
        ("requeue_time", pa.int64()),
        ("dequeue_count", pa.int32()),
        ("seq", pa.int64()),
    ]
)

#: Arrow ``binary`` has 32-bit offsets; cut record batches well below that.
MAX_BATCH_BYTES = 256 << 20


def to_arrow(cols: ReadColumns) -> Iterator[pa.RecordBatch]:
    """Record batches of ``cols`` without touching values one by one."""
    lengths, data = cols.lengths, cols.values
    lo, n, base = 0, len(lengths), 0
    while lo < n:
        hi, size = lo, 0
        while hi < n and (hi == lo or size + lengths[hi] <= MAX_BATCH_BYTES):
            size += lengths[hi]
            hi += 1
        offsets = pa.array(itertools.accumulate(lengths[lo:hi], initial=0), pa.int32())
        values = pa.Array.from_buffers(
            pa.binary(),
            hi - lo,
            [None, offsets.buffers()[1], pa.py_buffer(data[base : base + size])],
        )
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(cols.id[lo:hi], pa.int64()),
                pa.array(cols.receipt[lo:hi], pa.string()),
                values,
                pa.array(cols.deadline[lo:hi], pa.int64()),
                pa.array(cols.enqueue_time[lo:hi], pa.int64()),
                pa.array(cols.requeue_time[lo:hi], pa.int64()),
                pa.array(cols.dequeue_count[lo:hi], pa.int32()),
                pa.array(cols.seq[lo:hi], pa.int64()),
            ],
            schema=ARROW_SCHEMA,
        )
        lo, base = hi, base + size


def read_range(conn: Connection, part: LogRange, page: int) -> Iterator[pa.RecordBatch]:
    """Yield ``part`` as Arrow record batches, reading ``page`` log sequences per request."""
    with ConsumerClient(
        conn.url, conn.queue, conn.consumer, token=conn.token, timeout=conn.timeout_s
    ) as client:
        for lo in range(part.start, part.end, page):
            hi = min(lo + page, part.end)
            cols = client.read_columns(lo, hi)
            if not cols.found:
                log.warning(
                    "consumer %s/%s unknown to the server (restarted?): range [%d, %d) skipped; "
                    "its items are pending again",
                    conn.queue,
                    conn.consumer,
                    lo,
                    part.end,
                )
                return
            if cols.seq:
                yield from to_arrow(cols)
