"""Corruption table for the write-ahead log: each case states what is kept and what is reported.

The rule is decided by declared lengths alone. A record whose length runs past the end
of the file, or a complete last record that fails its checksum, is a torn tail (a crash
mid-write): recovery keeps every earlier record, copies the bad bytes aside and
truncates. A complete record that fails its checksum *followed by* more data is
corruption in the middle: an error naming file and offset, and the file is left
untouched. A payload is never searched for something that looks like a record.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dq.storage.codec import encode_key, encode_pending, encode_stats
from dq.storage.errors import CorruptionError
from dq.storage.wal import HEADER, RECORD_HEADER, encode_header, frame_record, read_wal, recover_wal

D = 1_800_000_000_000


def record(i: int) -> bytes:
    return frame_record(
        encode_pending(encode_key(D, i), encode_stats(D, 0, 0), bytes([i]) * (10 + i))
    )


def build(tmp_path: Path, n: int = 3) -> tuple[Path, list[int], bytes]:
    data = bytearray(encode_header(1, 1))
    offsets = []
    for i in range(1, n + 1):
        offsets.append(len(data))
        data += record(i)
    path = tmp_path / "0000000001.log"
    path.write_bytes(bytes(data))
    return path, offsets, bytes(data)


def test_intact_log_keeps_everything(tmp_path: Path) -> None:
    path, offsets, data = build(tmp_path)
    c = recover_wal(str(path))
    assert [o for o, _ in c.records] == offsets and c.torn_bytes == 0
    assert path.read_bytes() == data


def test_truncation_at_every_offset_of_the_last_record(tmp_path: Path) -> None:
    path, offsets, data = build(tmp_path)
    last = offsets[-1]
    for cut in range(last, len(data)):
        path.write_bytes(data[:cut])
        for aside in tmp_path.glob("*.torn-*"):
            aside.unlink()
        c = recover_wal(str(path))
        assert [o for o, _ in c.records] == offsets[:-1], cut
        assert c.valid_end == last
        assert path.stat().st_size == last  # truncated at the record boundary
        dropped = data[last:cut]
        asides = list(tmp_path.glob("*.torn-*"))
        if dropped.strip(b"\0"):
            assert [a.name for a in asides] == [f"{path.name}.torn-{last}"]
            assert asides[0].read_bytes() == data[last:cut]  # the bad bytes were kept aside
        else:
            assert asides == []  # only zeros: indistinguishable from preallocated space


@pytest.mark.parametrize("where", ["length", "crc", "type", "payload-first", "payload-last"])
def test_flipped_byte_in_the_last_record_is_a_torn_tail(tmp_path: Path, where: str) -> None:
    path, offsets, data = build(tmp_path)
    last = offsets[-1]
    pos = {
        "length": last + 3,
        "crc": last + 5,
        "type": last + 8,
        "payload-first": last + RECORD_HEADER.size,
        "payload-last": len(data) - 1,
    }[where]
    bad = bytearray(data)
    bad[pos] ^= 0x40
    path.write_bytes(bytes(bad))
    c = recover_wal(str(path))
    assert [o for o, _ in c.records] == offsets[:-1]
    assert path.stat().st_size == last
    assert (tmp_path / f"{path.name}.torn-{last}").read_bytes() == bytes(bad[last:])


@pytest.mark.parametrize("where", ["length-small", "crc", "payload"])
def test_damage_in_the_middle_is_an_error_with_file_and_offset(tmp_path: Path, where: str) -> None:
    path, offsets, data = build(tmp_path)
    mid = offsets[1]
    bad = bytearray(data)
    if where == "length-small":
        bad[mid + 3] ^= 0x01
    elif where == "length-huge":
        bad[mid] = 0x7F
    elif where == "crc":
        bad[mid + 4] ^= 0xFF
    else:
        bad[mid + RECORD_HEADER.size + 20] ^= 0x01
    path.write_bytes(bytes(bad))
    with pytest.raises(CorruptionError) as err:
        recover_wal(str(path))
    assert err.value.context["file"] == str(path)
    assert err.value.context["offset"] == mid
    assert path.read_bytes() == bytes(bad)  # nothing truncated
    assert not list(tmp_path.glob("*.torn-*"))


@pytest.mark.parametrize("pos", [0, 4, 8, 16, 28])
def test_damaged_header_is_an_error_at_offset_0(tmp_path: Path, pos: int) -> None:
    path, _offsets, data = build(tmp_path)
    bad = bytearray(data)
    bad[pos] ^= 0x01
    path.write_bytes(bytes(bad))
    with pytest.raises(CorruptionError) as err:
        read_wal(str(path))
    assert err.value.context["offset"] == 0


def test_short_header_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "0000000001.log"
    path.write_bytes(encode_header(1, 1)[: HEADER.size - 1])
    with pytest.raises(CorruptionError):
        read_wal(str(path))


def test_zero_filled_tail_is_the_end_of_preallocated_space(tmp_path: Path) -> None:
    path, offsets, data = build(tmp_path)
    path.write_bytes(data + bytes(4096))
    c = read_wal(str(path))
    assert [o for o, _ in c.records] == offsets and c.torn_bytes == 0


def test_torn_write_into_preallocated_space_is_cut(tmp_path: Path) -> None:
    path, offsets, data = build(tmp_path)
    partial = record(9)[:15]
    path.write_bytes(data + partial + bytes(1000))
    c = recover_wal(str(path))
    assert [o for o, _ in c.records] == offsets
    assert path.stat().st_size == len(data)


def test_a_length_running_past_the_end_is_a_torn_tail_whatever_follows(tmp_path: Path) -> None:
    """A damaged length field cannot be told from a torn write by lengths alone; the
    bytes after it are never parsed as records (they may be any value's bytes)."""
    path, offsets, data = build(tmp_path)
    mid = offsets[1]
    bad = bytearray(data)
    bad[mid] = 0x7F
    path.write_bytes(bytes(bad))
    c = recover_wal(str(path))
    assert [o for o, _ in c.records] == offsets[:1]
    assert path.stat().st_size == mid
    assert (tmp_path / f"{path.name}.torn-{mid}").read_bytes() == bytes(bad[mid:])


def test_a_torn_record_whose_value_holds_a_whole_record_is_a_torn_tail(tmp_path: Path) -> None:
    """A value may contain a well-formed log record; tearing the record that carries it
    must leave a torn tail, not "a bad record followed by a valid one"."""
    path, offsets, data = build(tmp_path, n=2)
    inner = record(7) * 3  # complete, valid records inside a value
    outer = frame_record(encode_pending(encode_key(D, 9), encode_stats(D, 0, 0), inner + b"x" * 50))
    whole = data + outer
    start = len(data) + RECORD_HEADER.size + 16 + 16 + 4  # where the value begins
    for cut in (start + len(inner), start + len(inner) // 2 + 3, len(whole) - 1):
        for aside in tmp_path.glob("*.torn-*"):
            aside.unlink()
        path.write_bytes(whole[:cut])
        c = recover_wal(str(path))
        assert [o for o, _ in c.records] == offsets, cut
        assert path.stat().st_size == len(data)
