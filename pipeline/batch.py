"""Batch read: the consumer's oldest un-acknowledged entries, topped up from the queue.

Planning (``partitions``, on the driver) asks the server to top the consumer's log up to
``maxItems`` entries from its first un-acknowledged one and splits that range over
``numPartitions``. So evaluating the same DataFrame again (a second action, or the
release action) sees the same items until they are acknowledged, and a job that died
before acknowledging gets its items back on its next run with the same ``consumer``
(within the consumer's idle timeout; after it the items go back to the queue).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition

from dq.client.groups import ConsumerClient
from dq.pipeline.options import ReadOptions
from dq.pipeline.reading import LogRange, note_missing_queue, read_range, split

__all__ = ["BatchReader"]

log = logging.getLogger(__name__)


class BatchReader(DataSourceReader):  # type: ignore[misc]
    """Holds only options (picklable); clients are created inside each call."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o, c = self.options, self.options.conn
        with ConsumerClient(c.url, c.queue, c.consumer, token=c.token, timeout=c.timeout_s) as cl:
            info = cl.open(lease_ms=o.lease_ms, idle_timeout_ms=o.idle_timeout_ms)
            got = cl.pull(info.first_unacked, o.max_items, lease_ms=o.lease_ms)
        note_missing_queue(c.queue, got)
        log.info(
            "dq batch read %s/%s: log range [%d, %d), %d newly leased",
            c.queue,
            c.consumer,
            got.start,
            got.end,
            got.pulled,
        )
        parts = split(got.start, got.end, o.num_partitions)
        # Spark wants at least one partition even when there is nothing to read.
        return parts or [LogRange(got.start, got.start)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogRange)
        yield from read_range(self.options.conn, partition, self.options.read_page_size)
