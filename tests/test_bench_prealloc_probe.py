"""bench/prealloc_probe.py's own counts, checked without perf: the child writes its
records through the engine's log and counts the allocations each policy makes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import prealloc_probe
from dq.storage import fileio
from dq.storage.wal import read_wal


@pytest.mark.parametrize(
    ("policy", "allocations"),
    [("append", 0), ("fixed 64 KiB", 2), ("fixed 1 MiB", 1), ("adaptive", 2)],
)
def test_the_child_counts_each_policys_allocations_and_leaves_a_whole_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], policy: str, allocations: int
) -> None:
    """300 records of 300 bytes are ~93 KB: two 64 KiB steps, or one of 1 MiB; the
    adaptive step's second allocation is its doubled one, to 128 KiB."""
    allocate = fileio.allocate
    prealloc_probe.child(str(tmp_path), *prealloc_probe.POLICIES[policy], 300, 300, 0.0)
    assert fileio.allocate is allocate  # the counting wrapper is taken off again
    out = capsys.readouterr().out
    got = dict(part.split("=") for part in out.split("RESULT", 1)[1].split())
    assert float(got["fallocate"]) == pytest.approx(allocations / 300, abs=1e-4)
    (log,) = tmp_path.glob("*.log")
    contents = read_wal(str(log))
    assert len(contents.records) == 300
    assert os.path.getsize(log) == contents.valid_end  # closed: the zeros given back
    if policy == "adaptive":
        assert int(got["ahead_at_end"]) == 128 * 1024 - contents.valid_end
