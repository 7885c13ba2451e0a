"""How an SQS message is stored as an item's value: the documented envelope, the
attribute digests SQS clients check, the attribute rules, message ids."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dq.server.sqs.errors import SqsError
from dq.server.sqs.messages import (
    MAGIC,
    Stored,
    check_attributes,
    decode,
    encode,
    md5_of_attributes,
    message_id,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "sqs.md"


def _doc_dump() -> bytes:
    """The hex dump of the example envelope in docs/sqs.md."""
    text = DOC.read_text()
    block = text.split("these 90 bytes", 1)[1].split("```", 2)[1]
    out = bytearray()
    for line in block.strip().splitlines():
        offset, _, hexes = line.partition("  ")
        assert int(offset, 16) == len(out)
        out += bytes.fromhex(hexes)
    return bytes(out)


def test_envelope_in_the_docs_decodes() -> None:
    raw = _doc_dump()
    assert len(raw) == 90 and raw.startswith(MAGIC)
    msg = decode(raw)
    assert msg.body == "hello"
    assert msg.attributes == {"color": {"DataType": "String", "StringValue": "red"}}
    assert encode(msg) == raw  # and we write exactly what the docs show


def test_plain_bodies_stay_plain_and_envelopes_round_trip() -> None:
    assert encode(Stored("héllo")) == "héllo".encode()
    full = Stored(
        "b",
        {
            "n": {"DataType": "Number.int", "StringValue": "5"},
            "d": {"DataType": "Binary", "BinaryValue": "AAE="},
        },
        {"AWSTraceHeader": {"DataType": "String", "StringValue": "Root=1"}},
        "g",
        "d1",
    )
    assert decode(encode(full)) == full
    # a native binary value that merely starts like an envelope is delivered as base64
    odd = MAGIC + b"\x00\x00\x00\x05notjs"
    msg = decode(odd)
    assert msg.attributes["dq.Encoding"]["StringValue"] == "base64"


def test_attribute_digests_match_sqs() -> None:
    # vectors computed by Amazon SQS, published with open-source SQS clients
    assert (
        md5_of_attributes({"SellerName": {"DataType": "String", "StringValue": "Example Store"}})
        == "cd28f3b68aeee4b2eac9c66f2f694b58"
    )
    assert (
        md5_of_attributes(
            {
                "ordinal": {"DataType": "Number", "StringValue": "1"},
                "category": {"DataType": "String", "StringValue": "test"},
            }
        )
        == "d21ae90c49061e927f57df5f5d72be1f"
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"AWS.x": {"DataType": "String", "StringValue": "v"}},
        {"a..b": {"DataType": "String", "StringValue": "v"}},
        {"a": {"DataType": "Text", "StringValue": "v"}},
        {"a": {"DataType": "Number", "StringValue": "twelve"}},
        {"a": {"DataType": "String", "StringValue": ""}},
        {"a": {"DataType": "Binary", "BinaryValue": "!!"}},
        {f"a{i}": {"DataType": "String", "StringValue": "v"} for i in range(11)},
    ],
)
def test_bad_attributes_are_refused(attrs: dict[str, dict[str, str]]) -> None:
    with pytest.raises(SqsError) as exc:
        check_attributes(attrs)
    assert exc.value.shape == "InvalidParameterValue"


def test_message_ids_are_uuids_that_carry_the_item_id_and_differ_per_queue() -> None:
    mid = message_id("jobs", 42)
    assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", mid)
    assert mid.replace("-", "").endswith(f"{42:016x}") and mid != message_id("other", 42)
