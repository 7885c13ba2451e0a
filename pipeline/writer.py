"""``df.write.format("dq")``: enqueue rows, or acknowledge rows a ``dq`` read returned.

Enqueue: each task sends its rows in batches of ``batchSize`` to the keyed-batch route
with the key ``{writeId}:{partitionId}:{batchNo}``. A retried task sends the same keys
(same write, same partition, same row order), and the server answers a key it has seen
with the first result instead of enqueuing again, so a retry does not double the rows
while the server remembers the key (an hour; not across a server restart).

Release/requeue (``action``): rows carry ``seq`` of a ``dq`` read with the same
``consumer``; each task acknowledges its rows' sequences (both are idempotent).
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from dq.client.groups import ConsumerClient, KeyedEnqueuer
from dq.pipeline.errors import OptionError
from dq.pipeline.options import WriteOptions

__all__ = ["Writer", "Written"]

log = logging.getLogger(__name__)


@dataclass
class Written(WriterCommitMessage):  # type: ignore[misc]
    """What one task did: rows sent, and how many of its batches the server had seen."""

    partition: int
    rows: int
    replayed_batches: int


def _value(v: Any) -> bytes:
    if isinstance(v, bytes | bytearray):
        return bytes(v)
    if isinstance(v, str):
        return v.encode("utf-8")
    raise TypeError(f"the value column must be binary or string, not {type(v).__name__}")


class Writer(DataSourceWriter):  # type: ignore[misc]
    """Created on the driver (which fixes ``write_id``) and pickled to every task."""

    def __init__(self, options: WriteOptions, schema: StructType) -> None:
        self.options = options
        names = set(schema.fieldNames())
        need = "value" if options.action == "enqueue" else "seq"
        if need not in names:
            raise OptionError(f"action {options.action!r} needs a {need!r} column")
        self.has_deadline = "deadline" in names
        self.has_delay = "delay_ms" in names
        self.write_id = options.write_id or uuid.uuid4().hex

    def write(self, iterator: Iterator[Any]) -> Written:
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        if self.options.action == "enqueue":
            return self._enqueue(partition, iterator)
        return self._acknowledge(partition, iterator)

    def _enqueue(self, partition: int, rows: Iterator[Any]) -> Written:
        o, c = self.options, self.options.conn
        count = replayed = batch_no = 0
        batch: list[tuple[bytes, int | None, int | None]] = []
        with KeyedEnqueuer(c.url, c.queue, token=c.token, timeout=c.timeout_s) as q:

            def flush() -> None:
                nonlocal replayed, batch_no, batch
                _, again = q.enqueue(f"{self.write_id}:{partition}:{batch_no}", batch)
                replayed += again
                batch_no += 1
                batch = []

            for row in rows:
                deadline = row["deadline"] if self.has_deadline else None
                delay = row["delay_ms"] if self.has_delay else None
                if deadline is not None:
                    delay = None
                batch.append((_value(row["value"]), deadline, delay))
                count += 1
                if len(batch) >= o.batch_size:
                    flush()
            if batch:
                flush()
        if replayed:
            log.info("partition %d: %d batches were already enqueued", partition, replayed)
        return Written(partition, count, replayed)

    def _acknowledge(self, partition: int, rows: Iterator[Any]) -> Written:
        o, c = self.options, self.options.conn
        # requeue takes a per-row ``delay_ms`` column, never ``deadline``: in rows of a
        # dq read that column is the item's old deadline
        groups: dict[int | None, list[int]] = defaultdict(list)
        for row in rows:
            delay = row["delay_ms"] if self.has_delay else o.delay_ms
            groups[delay].append(int(row["seq"]))
        count = 0
        with ConsumerClient(c.url, c.queue, c.consumer, token=c.token, timeout=c.timeout_s) as cl:
            for delay, seqs in groups.items():
                for i in range(0, len(seqs), o.batch_size * 10):
                    part = seqs[i : i + o.batch_size * 10]
                    if o.action == "release":
                        cl.ack(part)
                    else:
                        cl.requeue(part, delay_ms=delay)
                    count += len(part)
        return Written(partition, count, 0)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        done = [m for m in messages if isinstance(m, Written)]
        log.info(
            "dq %s %s: %d rows from %d tasks (%d batches de-duplicated)",
            self.options.action,
            self.write_id,
            sum(m.rows for m in done),
            len(done),
            sum(m.replayed_batches for m in done),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning(
            "dq %s %s aborted; rows of finished tasks stay enqueued. Re-run with "
            "option writeId=%s to skip them (while the server remembers the keys).",
            self.options.action,
            self.write_id,
            self.write_id,
        )
