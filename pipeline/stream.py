"""Streaming read: micro-batches are ranges of the consumer's delivery log.

The offset is ``{"seq": n}``, a position in the log. Facts of Spark 4.3's Python
streaming sources that shape this reader (measured, see ``docs/spark.md``):
``initialOffset`` is called twice, so it has no side effect beyond creating the consumer;
``read`` is retried with the same partition, so reading a range is replayable;
``commit(end)`` of batch N only comes while batch N+1 is planned (and never for the
last batch of a run), so ``latestOffset(start)`` itself acknowledges everything below
``start``: Spark calls it only after the batch ending at ``start`` is in the commit log.
``stop`` is never called, so nothing relies on it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from dq.client.groups import ConsumerClient
from dq.pipeline.options import ReadOptions
from dq.pipeline.reading import LogRange, note_missing_queue, read_range, split

__all__ = ["StreamReader"]

log = logging.getLogger(__name__)

Offset = dict[str, Any]


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Lives in one long-lived Python worker on the driver; its ``read`` runs pickled on executors."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._budget: int | None = None  # availableNow: items this run may still lease

    def _client(self) -> ConsumerClient:
        c = self.options.conn
        return ConsumerClient(c.url, c.queue, c.consumer, token=c.token, timeout=c.timeout_s)

    def initialOffset(self) -> Offset:
        """The consumer's first un-acknowledged entry: a new query re-reads what an
        abandoned query with the same consumer left un-acknowledged."""
        o = self.options
        with self._client() as cl:
            info = cl.open(lease_ms=o.lease_ms, idle_timeout_ms=o.idle_timeout_ms)
        return {"seq": info.first_unacked}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_items_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """Bound this run to the items due now, so ``availableNow`` terminates."""
        o = self.options
        with self._client() as cl:
            info = cl.open(lease_ms=o.lease_ms, idle_timeout_ms=o.idle_timeout_ms)
        self._budget = info.queue_due or 0
        log.info("dq availableNow run bounded to %d items due now", self._budget)

    def latestOffset(self, start: Offset, limit: ReadLimit) -> Offset:
        o = self.options
        if isinstance(limit, ReadMaxRows):
            max_items = limit.max_rows
        elif isinstance(limit, ReadAllAvailable):
            max_items = self._budget if self._budget is not None else o.max_items_per_trigger
        else:
            max_items = o.max_items_per_trigger
        after = int(start["seq"])
        with self._client() as cl:
            # Spark plans batch N+1 only after batch N (ending at ``start``) is committed.
            cl.commit(after)
            got = cl.pull(after, max_items, max_new=self._budget, lease_ms=o.lease_ms)
        note_missing_queue(o.conn.queue, got)
        if self._budget is not None:
            self._budget = max(0, self._budget - got.pulled)
        if got.end <= after:
            return start
        return {"seq": got.end}

    def partitions(self, start: Offset, end: Offset) -> Sequence[InputPartition]:
        o = self.options
        lo, hi = int(start["seq"]), int(end["seq"])
        n = max(o.min_partitions, -(-(hi - lo) // o.items_per_partition))
        return split(lo, hi, n)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)
        yield from read_range(self.options.conn, partition, self.options.read_page_size)

    def commit(self, end: Offset) -> None:
        with self._client() as cl:
            cl.commit(int(end["seq"]))
