"""Corruption table for segment files: which damage is caught on open (header, index,
footer — the only parts opening reads) and which on the first read of a block; each
error names the file and the offset."""

from __future__ import annotations

from pathlib import Path

import pytest

from dq.storage.codec import encode_key, encode_pending, encode_stats
from dq.storage.errors import CorruptionError
from dq.storage.segment import (
    FOOTER,
    HEADER,
    SegmentReader,
    write_segment,
    write_segment_grouped,
)

D = 1_800_000_000_000


def build(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "0000000001-0000000001.seg"
    entries = []
    for i in range(1, 3001):
        k = encode_key(D + i, i)
        entries.append((k, encode_pending(k, encode_stats(D, 0, 0), i.to_bytes(4, "big") * 20)))
    info = write_segment(str(path), entries, seg_lo=1, seg_hi=1, max_id=0)
    assert info is not None and info.block_count > 2
    return path, path.read_bytes()


def damage(path: Path, data: bytes, pos: int) -> None:
    bad = bytearray(data)
    bad[pos] ^= 0x01
    path.write_bytes(bytes(bad))


def test_intact(tmp_path: Path) -> None:
    path, _ = build(tmp_path)
    r = SegmentReader(str(path))
    assert sum(1 for _ in r.scan()) == 3000
    r.close()


@pytest.mark.parametrize("pos", [0, 5, 12])
def test_header_damage_fails_open_at_offset_0(tmp_path: Path, pos: int) -> None:
    path, data = build(tmp_path)
    damage(path, data, pos)
    with pytest.raises(CorruptionError) as err:
        SegmentReader(str(path))
    assert err.value.context == {"file": str(path), "offset": 0}


@pytest.mark.parametrize("field_offset", [0, 8, 20, 40, 56, 64, 72, 88, 96, 100, 110])
def test_footer_damage_fails_open(tmp_path: Path, field_offset: int) -> None:
    path, data = build(tmp_path)
    damage(path, data, len(data) - FOOTER.size + field_offset)
    with pytest.raises(CorruptionError) as err:
        SegmentReader(str(path))
    assert err.value.context["file"] == str(path)
    assert err.value.context["offset"] >= len(data) - FOOTER.size


def test_index_damage_fails_open_at_the_index(tmp_path: Path) -> None:
    path, data = build(tmp_path)
    r = SegmentReader(str(path))
    index_offset = r.info.index_offset
    r.close()
    damage(path, data, index_offset + 3)
    with pytest.raises(CorruptionError) as err:
        SegmentReader(str(path))
    assert err.value.context["offset"] == index_offset


def test_block_damage_is_caught_when_the_block_is_read(tmp_path: Path) -> None:
    path, data = build(tmp_path)
    damage(path, data, HEADER.size + 30)  # inside block 0
    r = SegmentReader(str(path))  # opening reads no block: still fine
    with pytest.raises(CorruptionError) as err:
        list(r.scan())
    assert err.value.context["offset"] == HEADER.size and err.value.context["block"] == 0
    r.close()


def test_group_column_damage_is_caught_when_its_block_is_read(tmp_path: Path) -> None:
    path = tmp_path / "0000000001-0000000001.seg"
    entries = []
    for i in range(1, 3001):
        k = encode_key(D + i, i)
        entry = encode_pending(k, encode_stats(D, 0, 0), i.to_bytes(4, "big") * 20)
        entries.append((k, entry, f"customer-{i % 7}"))
    info = write_segment_grouped(str(path), entries, seg_lo=1, seg_hi=1, max_id=0)
    assert info is not None and info.block_count > 2
    r = SegmentReader(str(path))
    column = r._group_rows[1][0]  # block 1's group column
    assert [g for _k, _e, g in r.scan_grouped()] == [e[2] for e in entries]
    r.close()
    damage(path, path.read_bytes(), column + 3)
    r = SegmentReader(str(path))
    try:
        with pytest.raises(CorruptionError, match="segment group column checksum mismatch") as err:
            list(r.scan_grouped())
        assert err.value.context == {"file": str(path), "offset": column, "block": 1}
    finally:
        r.close()


@pytest.mark.parametrize("keep", [0, 10, HEADER.size + 50, -FOOTER.size, -1])
def test_truncated_segment_fails_open(tmp_path: Path, keep: int) -> None:
    path, data = build(tmp_path)
    path.write_bytes(data[:keep])
    with pytest.raises(CorruptionError) as err:
        SegmentReader(str(path))
    assert err.value.context["file"] == str(path)
