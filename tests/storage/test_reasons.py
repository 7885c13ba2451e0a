"""An item's reasons (storage/reasons.py): their bounds, their error entry, and where
the memory keeps them."""

from __future__ import annotations

from pathlib import Path

import pytest

from dq.storage.errors import CorruptionError, OutOfRange
from dq.storage.itemmeta import ItemMeta, write_sidecar
from dq.storage.reasons import (
    MAX_ERROR_BYTES,
    MAX_REASONS,
    OLDER_REASON_BYTES,
    ItemErrors,
    Reason,
    check_error,
    decode_error_entry,
    encode_error_entry,
    with_reason,
)

D = 1_800_000_000_000


def test_an_error_is_text_of_at_most_4_kib() -> None:
    assert check_error("x" * MAX_ERROR_BYTES) == "x" * MAX_ERROR_BYTES
    with pytest.raises(OutOfRange, match=r"items\.3: error must be at most 4096 bytes"):
        check_error("€" * 1366, 3)  # 4098 bytes of UTF-8 in 1366 characters
    with pytest.raises(OutOfRange, match="error must be text"):
        check_error(b"bytes")
    with pytest.raises(OutOfRange, match="valid UTF-8"):
        check_error("\ud800")


def test_the_history_keeps_five_and_cuts_the_older_ones() -> None:
    history: tuple[Reason, ...] = ()
    for n in range(8):
        history = with_reason(history, Reason(f"{n}" + "é" * 2000, D + n, n + 1))
    assert len(history) == MAX_REASONS
    assert [r.delivery for r in history] == [8, 7, 6, 5, 4]
    assert len(history[0].error.encode()) == 4001  # the newest whole
    for r in history[1:]:
        raw = r.error.encode()
        assert len(raw) <= OLDER_REASON_BYTES and raw.decode() == r.error  # at a boundary


def test_an_entry_round_trips_and_a_damaged_one_is_refused() -> None:
    reasons = (Reason("now", D + 5, 2), Reason("before", D, 1))
    entry = encode_error_entry(9, D + 10, reasons)
    assert decode_error_entry(entry, 0) == (9, D + 10, reasons, len(entry))
    with pytest.raises(CorruptionError, match="cut short"):
        decode_error_entry(entry[:-1], 0)
    with pytest.raises(CorruptionError, match="not an error entry dq can read"):
        decode_error_entry(entry[:1] + b"\x02" + entry[2:], 0)  # version 2


def test_reasons_leave_memory_for_the_sidecar_and_come_back_from_it(tmp_path: Path) -> None:
    meta = ItemMeta()
    reasons = (Reason("boom", D, 1),)
    entry = encode_error_entry(4, D + 100, reasons)
    meta.errors.written(4, D + 100, 7, reasons)  # written in log 7
    assert meta.errors.notes[4].reasons == reasons
    write_sidecar(str(tmp_path), 7, b"\x02" + bytes(8) + b"\x01q" + entry)  # an origin, then it
    found = meta.frozen(str(tmp_path), 7)
    assert found == {4: 11}
    meta.errors.frozen(7, found)
    assert meta.errors.notes[4].reasons is None  # only where they are is kept
    assert meta.errors.reasons(str(tmp_path), 4) == reasons
    assert meta.errors.logs_in_use() == {7}
    assert meta.frozen(str(tmp_path), 8) is None  # no reasons written in log 8


def test_the_sweep_comes_round_to_every_note() -> None:
    errors = ItemErrors()
    for i in range(1, 6):
        errors.written(i, D, 1, (Reason("x", D, 1),))
    assert errors.next_to_check(3) == [1, 2, 3]
    errors.forget(4)
    assert errors.next_to_check(3) == [5, 1, 2]  # 4 is gone: skipped
    assert len(errors) == 4 and errors.logs_in_use() == {1}
