"""``StreamReader``'s driver side called directly, as Spark calls it (no Spark session)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("pyspark")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from dq.client import Client
from dq.client.groups import ConsumerClient
from dq.pipeline.options import ReadOptions
from dq.pipeline.reading import LogRange
from dq.pipeline.stream import StreamReader
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve


def reader(url: str, queue: str, **extra: str) -> StreamReader:
    options = {"url": url, "queue": queue, "consumer": "drv", "maxItemsPerTrigger": "40"}
    return StreamReader(ReadOptions.parse(options | extra))


def test_offsets_partitions_and_commit(server: LiveServer, queue: str) -> None:
    with Client(server.url) as dq:
        dq.enqueue_many(queue, [f"s{i}".encode() for i in range(100)])
        r = reader(server.url, queue, minPartitions="3")
        start = r.initialOffset()
        assert start == r.initialOffset() == {"seq": 0}  # called twice by Spark: harmless
        assert r.getDefaultReadLimit() == ReadMaxRows(40)
        end = r.latestOffset(start, ReadMaxRows(40))
        assert end == {"seq": 40}
        assert r.latestOffset(start, ReadMaxRows(40)) == end  # re-planned: same range
        parts = r.partitions(start, end)
        assert parts == [LogRange(0, 14), LogRange(14, 27), LogRange(27, 40)]
        rows = sum(batch.num_rows for p in parts for batch in r.read(p))
        assert rows == 40
        nxt = r.latestOffset(end, ReadMaxRows(40))  # batch 0 is done: released here
        assert nxt == {"seq": 80}
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased) == (60, 40)
        r.commit(nxt)
        assert dq.queue(queue).stats.pending == 20
        assert list(r.read(LogRange(0, 80))) == []  # acknowledged: gone from the log


def test_available_now_is_bounded_by_what_was_due(server: LiveServer, queue: str) -> None:
    with Client(server.url) as dq:
        dq.enqueue_many(queue, [f"a{i}".encode() for i in range(50)])
        r = reader(server.url, queue)
        r.prepareForTriggerAvailableNow()
        dq.enqueue_many(queue, [f"late{i}".encode() for i in range(50)])  # after the start
        offset, batches = r.initialOffset(), 0
        while (nxt := r.latestOffset(offset, ReadAllAvailable())) != offset:
            offset, batches = nxt, batches + 1
            assert batches < 10
        assert offset == {"seq": 50}
        assert dq.queue(queue).stats.pending == 50  # the late items are left for later
    with ConsumerClient(server.url, queue, "drv") as c:
        info = c.info()
        assert info is not None and info.in_flight == 0


def test_server_restart_mid_batch(tmp_path: Path) -> None:
    """The log dies with the server: executors skip the void range, the driver carries on
    from its offset, and the items come again in a later batch (at least once)."""
    with live_server(tmp_path / "data") as s:
        with Client(s.url) as dq:
            dq.enqueue_many("restart", [f"r{i}".encode() for i in range(30)])
        r = reader(s.url, "restart")
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(40))
        assert end == {"seq": 30}
        s.terminate(timeout=15)
        s.start()
        (part,) = r.partitions(start, end)
        assert list(r.read(part)) == []  # batch 0 runs and finds its range void
        nxt = r.latestOffset(end, ReadMaxRows(40))
        assert nxt == {"seq": 60}  # sequences never go backwards
        values = [
            v.as_py() for p in r.partitions(end, nxt) for b in r.read(p) for v in b.column("value")
        ]
        assert sorted(values) == sorted(f"r{i}".encode() for i in range(30))
        r.latestOffset(nxt, ReadMaxRows(40))
        with Client(s.url) as dq:
            assert dq.queue("restart").stats.pending == 0


def test_a_queue_nobody_created_is_said_once(
    server: LiveServer, queue: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A job reading a misspelled (or not yet created) queue reads 0 items, and says
    why in the log, once; the reading goes on and finds the items once it exists."""
    r = reader(server.url, queue + "-typo")
    start = r.initialOffset()
    with caplog.at_level("WARNING", logger="dq.pipeline.reading"):
        for _ in range(3):
            assert r.latestOffset(start, ReadMaxRows(40)) == start
    said = [m for m in caplog.messages if "does not exist" in m]
    assert said == [f"dq queue {queue}-typo does not exist (yet): nothing to read until a "
                    "producer creates it (is the name right?)"]  # fmt: skip
    with Client(server.url) as dq:
        dq.enqueue(queue + "-typo", b"late")
    assert r.latestOffset(start, ReadMaxRows(40)) == {"seq": 1}


def test_reading_a_batch_acknowledges_nothing(server: LiveServer, queue: str) -> None:
    """Only Spark's commit of a micro-batch acknowledges its items (``latestOffset`` of
    the next batch, or ``commit``). Reading its range — which a failed task does again —
    leaves every item leased and the range readable: a task retried, or a query that
    dies before the commit and starts again with the same consumer, reads the same items
    (at least once). Acknowledged on read, they would be gone with the batch that failed."""
    with Client(server.url) as dq:
        dq.enqueue_many(queue, [f"n{i}".encode() for i in range(30)])
        r = reader(server.url, queue, minPartitions="2")
        start = r.initialOffset()
        end = r.latestOffset(start, ReadMaxRows(40))
        assert end == {"seq": 30}

        def values(reader: StreamReader) -> list[bytes]:
            batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
            return sorted(v.as_py() for b in batches for v in b.column("value"))

        expected = sorted(f"n{i}".encode() for i in range(30))
        assert values(r) == expected
        assert values(r) == expected, "a retried task found its range acknowledged"
        stats = dq.queue(queue).stats
        assert (stats.pending, stats.leased) == (30, 30), "reading acknowledged items"

        again = reader(server.url, queue, minPartitions="2")  # the query started again
        assert again.initialOffset() == start
        assert values(again) == expected
        assert again.latestOffset(end, ReadMaxRows(40)) == end  # batch 0 committed
        assert dq.queue(queue).stats.pending == 0
