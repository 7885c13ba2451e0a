"""Partition splitting and the column → Arrow conversion (no Spark session needed)."""

from __future__ import annotations

import pickle

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from dq.client.groups import ReadColumns  # noqa: E402
from dq.pipeline import reading  # noqa: E402
from dq.pipeline.reading import ARROW_SCHEMA, LogRange, split, to_arrow  # noqa: E402


@pytest.mark.parametrize(
    ("start", "end", "parts", "expected"),
    [
        (0, 10, 4, [(0, 3), (3, 6), (6, 8), (8, 10)]),
        (5, 7, 4, [(5, 6), (6, 7)]),
        (3, 3, 4, []),
        (0, 1, 1, [(0, 1)]),
    ],
)
def test_split(start: int, end: int, parts: int, expected: list[tuple[int, int]]) -> None:
    got = split(start, end, parts)
    assert [(p.start, p.end) for p in got] == expected
    assert pickle.loads(pickle.dumps(got)) == got


def columns(values: list[bytes]) -> ReadColumns:
    n = len(values)
    return ReadColumns(
        found=True,
        epoch="e",
        seq=list(range(100, 100 + n)),
        id=list(range(1, n + 1)),
        receipt=[f"r{i}" for i in range(n)],
        deadline=[7] * n,
        enqueue_time=[8] * n,
        requeue_time=[0] * n,
        dequeue_count=[1] * n,
        lease_expires=[9] * n,
        lengths=[len(v) for v in values],
        values=b"".join(values),
    )


def test_to_arrow_keeps_every_value(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [b"", b"a", bytes(range(256)), b"\x00" * 5, b"tail"]
    monkeypatch.setattr(reading, "MAX_BATCH_BYTES", 256)  # forces several batches
    batches = list(to_arrow(columns(values)))
    assert len(batches) > 1
    assert all(b.schema == ARROW_SCHEMA for b in batches)
    table = pa.Table.from_batches(batches)
    assert table.column("value").to_pylist() == values
    assert table.column("seq").to_pylist() == [100, 101, 102, 103, 104]
    assert table.column("receipt").to_pylist() == ["r0", "r1", "r2", "r3", "r4"]


def test_log_range_is_an_input_partition() -> None:
    from pyspark.sql.datasource import InputPartition

    assert isinstance(LogRange(1, 2), InputPartition)
