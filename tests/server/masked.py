"""Raw HTTP answers with what differs from run to run masked out, so the answers of two
servers (the fast path and the framework behind it, tests/server/test_hot_path.py and
test_known_heads.py) can be compared byte for byte: the ``date`` header, times in ms
since the epoch, and each receipt's random part (its id and delivery stay)."""

from __future__ import annotations

import re

__all__ = ["mask"]

_DATE = re.compile(rb"^date: [^\r]*\r\n", re.MULTILINE | re.IGNORECASE)
_TIME = re.compile(rb"\b1\d{12}\b")
_RECEIPT = re.compile(rb'"[0-9a-f]{8}\.([0-9a-f]+)\.([0-9a-f]+)"')


def mask(raw: bytes) -> bytes:
    raw = _DATE.sub(b"date: -\r\n", raw)
    raw = _TIME.sub(b"T" * 13, raw)
    return _RECEIPT.sub(rb'"RRRRRRRR.\1.\2"', raw)
