"""``SegmentSet``, the queue's in-memory segments and segment files, on its own: a log's
way from the current in-memory segment to a frozen one to a segment file in the view,
the bookkeeping of rotations and merges (their backoffs, the ranges a merge may take),
and finding an entry wherever it lives now."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from dq.storage.codec import MAX_ID, PENDING_HEADER, TOMBSTONE, encode_key, encode_stats
from dq.storage.compactor import freeze_log
from dq.storage.errors import InvalidArgument
from dq.storage.segment_set import SegmentSet
from dq.storage.wal import WalWriter

ST = encode_stats(1, 0, 0)


def written_log(directory: Path, no: int, items: list[tuple[int, int]]) -> str:
    """A closed log ``no`` holding pending entries (deadline, id); its path."""
    wal = WalWriter.create(str(directory), no, 1)
    for deadline, item_id in items:
        value = b"v%d" % item_id
        wal.append(PENDING_HEADER.pack(encode_key(deadline, item_id), ST, len(value)) + value)
    wal.close(sync=True)
    return wal.path


def frozen_into_segment(
    files: SegmentSet, tmp_path: Path, no: int, items: list[tuple[int, int]]
) -> None:
    """Log ``no`` rotated out, frozen and installed, its entries in the memseg meanwhile."""
    path = written_log(tmp_path, no, items)
    for deadline, item_id in items:
        files.memseg.add(encode_key(deadline, item_id), ST, b"v%d" % item_id)
    ro, mem = files.rotated(path, no + 1)
    files.install_frozen(ro, mem, freeze_log(ro, str(tmp_path)), b"")


def test_a_rotated_log_is_frozen_then_its_segment_file_replaces_it(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    path = written_log(tmp_path, 1, [(10, 1), (20, 2)])
    files.memseg.add(encode_key(10, 1), ST, b"v1")
    files.memseg.add(encode_key(20, 2), ST, b"v2")
    ro, mem = files.rotated(path, 2)
    assert ro == path + "_ro" and os.path.exists(ro) and not os.path.exists(path)
    assert files.frozen == [(ro, mem)] and files.memseg.segment_no == 2
    assert files.view.memsegs == [files.memseg, mem] and files.unfrozen_logs() == [1, 2]
    assert files.is_frozen(mem)
    result = freeze_log(ro, str(tmp_path))
    files.install_frozen(ro, mem, result, b"")
    assert not os.path.exists(ro)  # deleted before the segment joins the set
    assert files.frozen == [] and [r.seg_lo for r in files.segments] == [1]
    assert mem.replaced_by is files.segments[0] and not files.is_frozen(mem)
    assert files.view.memsegs == [files.memseg] and files.unfrozen_logs() == [2]
    top = files.view.peek(b"")
    assert top is not None and top[0] == encode_key(10, 1)  # the view reads the file now
    assert files.lookup(encode_key(20, 2), None) == (ST, b"v2")
    assert files.lookup(encode_key(20, 2), mem) == (ST, b"v2")  # through the hint
    assert files.lookup(encode_key(30, 3), None) is None
    files.close()


def test_a_log_that_cannot_be_renamed_is_frozen_as_it_is(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    missing = str(tmp_path / "0000000001.log")
    ro, _mem = files.rotated(missing, 2)
    assert ro == missing  # recovery reads a closed ``.log`` as it reads a ``.log_ro``


def test_rotation_waits_for_frozen_logs_and_backs_off_after_a_failure(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    assert files.may_rotate(max_frozen=2) and files.rotate_requested
    files.rotation_started()
    assert not files.rotate_requested
    files.frozen = [("a", files.memseg), ("b", files.memseg)]
    assert not files.may_rotate(max_frozen=2) and files.rotate_requested
    files.frozen = []
    files.rotation_failed(2, 1, OSError("disk full"))
    assert files.rotation_failures == 1
    assert not files.may_rotate(max_frozen=2)  # backing off (50 ms after a first failure)
    time.sleep(0.06)
    assert files.may_rotate(max_frozen=2)


def test_a_merge_takes_a_contiguous_range_of_segment_files_only(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    frozen_into_segment(files, tmp_path, 1, [(10, 1)])
    frozen_into_segment(files, tmp_path, 2, [(20, 2)])
    assert files.start_merge(2, 2) is None  # nothing in the range
    inputs, drop_rogue = files.start_merge(0, 2) or ([], False)
    assert [r.seg_lo for r in inputs] == [1, 2] and drop_rogue and files.merging
    with pytest.raises(InvalidArgument, match="already running"):
        files.start_merge(0, 1)
    files.merge_finished()
    inputs, drop_rogue = files.start_merge(1, 2) or ([], True)
    assert [r.seg_lo for r in inputs] == [2] and not drop_rogue  # not from the oldest
    files.merge_stopped()
    assert not files.merging
    files.close()


def test_a_merge_never_spans_a_log_without_its_segment_file(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    frozen_into_segment(files, tmp_path, 1, [(10, 1)])
    path = written_log(tmp_path, 2, [(20, 2)])
    ro, mem = files.rotated(path, 3)  # log 2 frozen, its segment file not written yet
    frozen_into_segment(files, tmp_path, 3, [(30, 3)])
    assert [(r.seg_lo, r.seg_hi) for r in files.segments] == [(1, 1), (3, 3)]
    with pytest.raises(InvalidArgument, match="span log 2"):
        files.start_merge(0, 2)
    taken = files.start_merge(0, 1)
    assert taken is not None and taken[1]  # nothing older than log 1 can need its tombstones
    files.merge_finished()
    files.install_frozen(ro, mem, freeze_log(ro, str(tmp_path)), b"")
    assert [(r.seg_lo, r.seg_hi) for r in files.segments] == [(1, 1), (2, 2), (3, 3)]
    files.close()


def test_rogue_tombstones_stay_while_an_older_log_waits_for_its_segment_file(
    tmp_path: Path,
) -> None:
    files = SegmentSet("q", str(tmp_path))
    path = written_log(tmp_path, 1, [(10, 1)])
    files.rotated(path, 2)  # log 1 frozen, its segment file not written yet
    frozen_into_segment(files, tmp_path, 2, [(20, 2)])
    taken = files.start_merge(0, 1)
    assert taken is not None and not taken[1]  # log 1 may hold what they cancel
    files.close()


def test_an_installed_merge_replaces_its_inputs(tmp_path: Path) -> None:
    from dq.storage.compactor import merge_segments

    files = SegmentSet("q", str(tmp_path))
    frozen_into_segment(files, tmp_path, 1, [(10, 1)])
    frozen_into_segment(files, tmp_path, 2, [(20, 2)])
    taken = files.start_merge(0, 2)
    assert taken is not None
    inputs, drop_rogue = taken
    out = merge_segments([r.path for r in inputs], str(tmp_path), drop_rogue=drop_rogue)
    files.merge_finished()
    files.install_merge(inputs, out, b"")
    assert [(r.seg_lo, r.seg_hi) for r in files.segments] == [(1, 2)]
    assert all(r.replaced_by is files.segments[0] and r.closed for r in inputs)
    assert not any(os.path.exists(r.path) for r in inputs if r.path != out)
    assert files.view.next_live(b"", encode_key(100, MAX_ID, TOMBSTONE), None)[1] is not None
    assert files.lookup(encode_key(20, 2), inputs[1]) == (ST, b"v2")  # hint followed
    files.close()


def test_a_failed_merge_backs_off_1_s_doubling_to_60_s(tmp_path: Path) -> None:
    files = SegmentSet("q", str(tmp_path))
    files.merging = True
    assert [files.merge_failed() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert not files.merging and files.merge_backing_off()
    files.merge_finished()
    assert files.merge_failed() == 1  # a merge that worked starts the backoff over
