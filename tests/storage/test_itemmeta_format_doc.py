"""docs/format.md's item-metadata examples (type-2 log record, ``.meta`` sidecar),
decoded by the code, and the code producing exactly those bytes."""

from __future__ import annotations

import json
from pathlib import Path

from dq.storage.codec import (
    TOMBSTONE,
    decode_key,
    decode_stats,
    encode_key,
    encode_pending,
    encode_stats,
    iter_entries,
)
from dq.storage.compactor import freeze_log
from dq.storage.itemmeta import (
    ItemMeta,
    decode_meta,
    encode_group_entry,
    encode_key_entry,
    encode_origin_entry,
    encode_schedule_entry,
    groups_of,
    read_sidecar,
    write_sidecar,
)
from dq.storage.reasons import Reason, decode_error_entry, encode_error_entry
from dq.storage.recovery import load_log
from dq.storage.schedule_store import decode, encode
from dq.storage.segment import SegmentReader
from tests.storage.test_format_doc import DOC, D, example, example_log, one_record_log


def test_wal_meta_example_decodes(tmp_path: Path) -> None:
    data, _, contents = example_log(tmp_path, "wal-meta-example", "0000000005.log")
    assert (contents.segment_no, contents.id_floor, contents.torn_bytes) == (5, 1, 0)
    [(offset, meta)] = contents.meta
    assert offset == 0x20
    assert list(decode_meta(meta)) == [("key", 1, D, D, "order-7")]
    [(entries_at, payload)] = contents.records
    assert entries_at + 9 == 0x4E  # the offset points the entries' base at their bytes
    [(key, stats, value, _)] = list(iter_entries(payload))
    assert (decode_key(key), stats and decode_stats(stats), value) == (
        (D, 1, 0),
        (D, 0, 0),
        b"hello",
    )
    entries = encode_pending(encode_key(D, 1), encode_stats(D, 0, 0), b"hello")
    assert one_record_log(5, entries, encode_key_entry(1, D, D, b"order-7")) == data


def test_sidecar_example_decodes_and_is_what_the_writer_writes(tmp_path: Path) -> None:
    data = example("meta-sidecar-example")
    path = tmp_path / "0000000005.meta"
    path.write_bytes(data)
    no, meta = read_sidecar(str(path))
    assert no == 5
    assert list(decode_meta(meta)) == [("key", 1, D, D, "order-7"), ("origin", 3, 0, 0, "jobs")]
    out = tmp_path / "out"
    out.mkdir()
    written = write_sidecar(
        str(out), 5, encode_key_entry(1, D, D, b"order-7") + encode_origin_entry(3, "jobs")
    )
    assert Path(written).read_bytes() == data
    m = ItemMeta()
    assert m.load(meta, str(path), D + 1000, 300_000)
    assert m.origins == {3: "jobs"} and m.keys["order-7"].id == 1


def test_wal_schedule_example_decodes(tmp_path: Path) -> None:
    data, path, contents = example_log(tmp_path, "wal-schedule-example", "0000000006.log")
    [(_offset, meta)] = contents.meta
    assert list(decode_meta(meta)) == [
        ("key", 1, D, D, "schedule:beat:1800000000000"),
        ("schedule", 42, D, 1, "beat"),
    ]
    [(_at, payload)] = contents.records
    [(key, _stats, value, _)] = list(iter_entries(payload))
    assert (decode_key(key), value) == ((D, 1, 0), b"hello")
    meta = encode_key_entry(1, D, D, b"schedule:beat:1800000000000")
    meta += encode_schedule_entry(42, D, 1, "beat")
    entries = encode_pending(encode_key(D, 1), encode_stats(D, 0, 0), b"hello")
    assert one_record_log(6, entries, meta) == data
    m = ItemMeta()
    assert m.load(meta, str(path), D, 300_000)  # progress keeps its sidecar
    assert (m.fired[42].tick, m.fired[42].count, m.fired[42].durable_tick) == (D, 1, D)


def test_schedule_file_example_decodes() -> None:
    text = DOC.read_text()
    block = text[text.index("## `schedule.<name>.json`") :]
    raw = json.loads(
        block[block.index("```json") + 7 : block.index("```", block.index("```json") + 7)]
    )
    s = decode("jobs", raw)
    assert (s.name, s.id, s.timing.every_ms, s.value, s.group, s.catch_up) == (
        "beat",
        42,
        60000,
        b"hello",
        "reports",
        "latest",
    )
    assert encode(s) == raw


def test_wal_group_example_decodes(tmp_path: Path) -> None:
    data, path, contents = example_log(tmp_path, "wal-group-example", "0000000007.log")
    [(offset, meta)] = contents.meta
    assert offset == 0x20
    assert list(decode_meta(meta)) == [
        ("group", 1, 0, 0, "customer-42"),
        ("group", 2, 0, 0, "customer-42"),
    ]
    assert groups_of(meta) == {1: "customer-42", 2: "customer-42"}
    mem, top = load_log(str(path))
    assert top == 3
    grouped = {k: g for k in mem.keys if (g := mem.group_of(k)) is not None}
    assert grouped == {encode_key(D, 1): "customer-42", encode_key(D, 2): "customer-42"}
    assert mem.group_names == ("customer-42",)
    meta_bytes = encode_group_entry(1, "customer-42") + encode_group_entry(2, "customer-42")
    entries = b"".join(
        encode_pending(encode_key(D, n), encode_stats(D, 0, 0), value)
        for n, value in ((1, b"hello"), (2, b"world"), (3, b"!"))
    )
    assert one_record_log(7, entries, meta_bytes) == data


def test_segment_groups_example_is_what_freezing_writes(tmp_path: Path) -> None:
    log = tmp_path / "0000000007.log_ro"
    log.write_bytes(example("wal-group-example"))
    done = freeze_log(str(log), str(tmp_path))
    assert done.path is not None
    assert Path(done.path).read_bytes() == example("segment-groups-example")
    assert not list(tmp_path.glob("*.meta"))  # groups go to the segment, not a sidecar
    r = SegmentReader(done.path)
    try:
        assert r.info.flags == 1 and r.has_groups
        assert r.info.index_offset == 0x73
        rows = list(r.scan_grouped())
        assert [(decode_key(k), g) for k, _e, g in rows] == [
            ((D, 1, 0), "customer-42"),
            ((D, 2, 0), "customer-42"),
            ((D, 3, 0), None),
        ]
        assert r.get_grouped(encode_key(D, 2)) == (encode_stats(D, 0, 0), b"world", "customer-42")
    finally:
        r.close()


def test_wal_error_example_decodes(tmp_path: Path) -> None:
    data, path, contents = example_log(tmp_path, "wal-error-example", "0000000008.log")
    [(_offset, meta)] = contents.meta
    assert list(decode_meta(meta)) == [("error", 1, D + 1000, 0, "")]
    assert decode_error_entry(meta, 0) == (1, D + 1000, (Reason("boom", D, 1),), len(meta))
    [(_at, payload)] = contents.records
    entries = [(decode_key(k), s and decode_stats(s), v) for k, s, v, _ in iter_entries(payload)]
    assert entries == [((D + 1000, 1, 0), (D, D, 1), b"hello"), ((D, 1, 3), None, None)]
    written = encode_pending(encode_key(D + 1000, 1), encode_stats(D, D, 1), b"hello")
    written += encode_key(D, 1, TOMBSTONE)
    error = encode_error_entry(1, D + 1000, (Reason("boom", D, 1),))
    assert one_record_log(8, written, error) == data
    m = ItemMeta()
    assert m.load(meta, str(path), D, 300_000, log=8)  # reasons keep their sidecar
    assert m.errors.reasons(str(tmp_path), 1) == (Reason("boom", D, 1),)


def test_wal_cancel_example_decodes(tmp_path: Path) -> None:
    """A cancel by key: the key's id-0 entry frees the key when the log is read back,
    and the record is what the writer frames."""
    data, path, contents = example_log(tmp_path, "wal-cancel-example", "0000000009.log")
    [(_offset, meta)] = contents.meta
    assert list(decode_meta(meta)) == [("key", 0, 0, D, "order-7")]
    [(_at, payload)] = contents.records
    assert [(decode_key(k), s, v) for k, s, v, _ in iter_entries(payload)] == [
        ((D, 1, 3), None, None)
    ]
    written = encode_key(D, 1, TOMBSTONE)
    assert one_record_log(9, written, encode_key_entry(0, 0, D, b"order-7")) == data
    m = ItemMeta()
    m.load(encode_key_entry(1, D, D, b"order-7"), "enqueue", D, 300_000, log=5)
    assert m.lookup("order-7", D, 300_000) is not None
    m.load(meta, str(path), D, 300_000, log=9)
    assert m.lookup("order-7", D, 300_000) is None
