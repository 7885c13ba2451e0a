"""docs/format.md's worked examples, decoded by the code: the doc and the code agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dq.storage.codec import (
    decode_key,
    decode_stats,
    encode_key,
    encode_pending,
    encode_stats,
    iter_entries,
    tombstone_of,
)
from dq.storage.replication import (
    FRAME_HEADER,
    KIND_CONTROL,
    KIND_RECORD,
    decode_control,
    decode_frames,
)
from dq.storage.segment import FOOTER, HEADER, INDEX_ROW, SegmentReader
from dq.storage.wal import WalContents, encode_header, frame_record, read_wal, record_body

DOC = Path(__file__).resolve().parents[2] / "docs" / "format.md"
D = 1_800_000_000_000


def example(name: str) -> bytes:
    text = DOC.read_text()
    m = re.search(rf"```hex {name}\n(.*?)```", text, re.S)
    assert m, f"no hex block {name!r} in docs/format.md"
    out = bytearray()
    for line in m.group(1).splitlines():
        _, _, hexes = line.partition(":")
        out += bytes.fromhex(hexes)
    return bytes(out)


def example_log(tmp_path: Path, name: str, file: str) -> tuple[bytes, Path, WalContents]:
    """The example ``name`` written as the log ``file``, and what the reader reads of it."""
    data = example(name)
    path = tmp_path / file
    path.write_bytes(data)
    return data, path, read_wal(str(path))


def one_record_log(segment_no: int, entries: bytes, meta: bytes = b"") -> bytes:
    """A log (id floor 1) of one record, framed as the writer frames it."""
    kind, body = record_body(entries, meta)
    return encode_header(segment_no, 1) + frame_record(body, kind)


def test_struct_sizes_match_the_doc() -> None:
    assert HEADER.size == 16 and INDEX_ROW.size == 40 and FOOTER.size == 112


def test_key_example() -> None:
    key = encode_key(D, 1)
    assert key.hex() == "0000068c617140000000000000000004"
    assert decode_key(key) == (D, 1, 0)
    assert encode_stats(D, 0, 0).hex() == "01a3185c500000000000000000000000"


def test_wal_example_decodes(tmp_path: Path) -> None:
    data, _, contents = example_log(tmp_path, "wal-example", "0000000003.log")
    assert (contents.segment_no, contents.id_floor, contents.torn_bytes) == (3, 1, 0)
    [(offset, payload)] = contents.records
    assert offset == 0x20
    entries = list(iter_entries(payload))
    assert [(decode_key(k), s and decode_stats(s), v) for k, s, v, _ in entries] == [
        ((D, 1, 0), (D, 0, 0), b"hello"),
        ((D - 5, 7, 3), None, None),
    ]
    # and the encoder produces exactly these bytes
    p = encode_pending(encode_key(D, 1), encode_stats(D, 0, 0), b"hello")
    assert one_record_log(3, p + tombstone_of(encode_key(D - 5, 7))) == data


def test_segment_example_decodes(tmp_path: Path) -> None:
    path = tmp_path / "0000000004-0000000004.seg"
    path.write_bytes(example("segment-example"))
    r = SegmentReader(str(path))
    try:
        assert (r.info.pending_count, r.info.tombstone_count, r.info.max_id) == (2, 1, 2)
        assert (r.seg_lo, r.seg_hi, r.info.block_count) == (4, 4, 1)
        assert r.info.first_key == encode_key(D, 1)
        assert r.info.last_key == tombstone_of(encode_key(D + 1000, 2))
        assert r.info.index_offset == 0x55
        rows = list(r.scan())
        assert [decode_key(k) for k, _ in rows] == [(D, 1, 0), (D + 1000, 2, 0), (D + 1000, 2, 3)]
        assert r.get(encode_key(D + 1000, 2)) == (encode_stats(D, D + 500, 2), b"world")
    finally:
        r.close()


@pytest.mark.parametrize("name", ["wal-example", "segment-example"])
def test_examples_start_with_their_magic(name: str) -> None:
    assert example(name)[:4] in (b"DQWL", b"DQSG")


def test_frame_example_decodes() -> None:
    data = example("frame-example")
    record, control = decode_frames(data)
    assert (record.lsn, record.queue, record.kind) == (7, "jobs", KIND_RECORD)
    [(key, stats, value, _)] = list(iter_entries(record.payload))
    assert decode_key(key) == (D, 1, 0)
    assert decode_stats(stats) == (D, 0, 0)
    assert value == b"hello"
    assert (control.lsn, control.kind) == (8, KIND_CONTROL)
    assert decode_control(control) == {"op": "paused", "paused": True, "since": D}
    assert FRAME_HEADER.size == 18
