"""docs/shm.md's worked examples as bytes, for the tests of each ring to decode and to
produce: the document and the code must agree byte for byte.

An example is a fenced block of hex after ``<!-- example:NAME -->``; white space and
line breaks between the bytes are free.
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DOC", "doc_example"]

DOC = Path(__file__).resolve().parents[2] / "docs" / "shm.md"


def doc_example(name: str) -> bytes:
    match = re.search(rf"<!-- example:{name} -->\n```\n(.*?)```", DOC.read_text(), re.S)
    assert match is not None, name
    return bytes.fromhex(match.group(1).replace("\n", " "))
