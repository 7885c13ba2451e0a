"""How an SQS message lives in a dq item, and the digests SQS clients check.

A message sent with nothing but a body is stored as the body's UTF-8 bytes, so a
consumer of the native API reads exactly what was sent. A message that carries more
(message attributes, system attributes, a group or deduplication id) is stored in an
*envelope*, laid out byte for byte in docs/sqs.md ("The envelope"):

    magic   8 bytes   FF 44 51 53 51 53 00 01   ("\\xffDQSQS\\x00\\x01")
    length  4 bytes   header length H, unsigned big-endian
    header  H bytes   UTF-8 JSON object (the keys of ``Stored`` that are set)
    body    the rest  the message body, UTF-8

The first byte 0xFF never occurs in UTF-8, so no text value (no SQS body, no text
enqueued natively) can be mistaken for an envelope. A native value that is not UTF-8
is delivered base64-encoded with the message attribute ``dq.Encoding = base64``.

Digests follow SQS: ``MD5OfBody`` is the MD5 of the body's UTF-8 bytes;
``MD5OfMessageAttributes`` is the MD5 of, for each attribute sorted by name: name,
data type, a transport byte (1 string/number, 2 binary) and the value, each of the
three strings preceded by its 4-byte big-endian length.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import struct
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from dq.server.sqs.errors import SqsError

__all__ = [
    "DEADLINE_ATTRIBUTE",
    "ENCODING_ATTRIBUTE",
    "MAGIC",
    "Attributes",
    "Stored",
    "attributes_size",
    "check_attributes",
    "check_text",
    "decode",
    "encode",
    "md5_hex",
    "md5_of_attributes",
    "message_id",
]

MAGIC = b"\xffDQSQS\x00\x01"
_LEN = struct.Struct(">I")
#: A Number attribute with this name sets the message's deadline (ms since the epoch).
DEADLINE_ATTRIBUTE = "dq.Deadline"
#: Added on delivery of a native value that is not UTF-8 (its body is then base64).
ENCODING_ATTRIBUTE = "dq.Encoding"
#: SQS's limit on message attributes per message.
MAX_ATTRIBUTES = 10

#: name → {"DataType": ..., "StringValue": ...} or {"DataType": ..., "BinaryValue": base64}
Attributes = dict[str, dict[str, str]]

# Characters SQS accepts in a body or string value (XML 1.0's Char production).
_BAD_CHAR = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTR_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_DATA_TYPE = re.compile(r"(String|Number|Binary)(\.[^\s].{0,248})?", re.S)


@dataclass(slots=True)
class Stored:
    """One SQS message as kept in an item's value."""

    body: str
    attributes: Attributes = field(default_factory=dict)
    system_attributes: Attributes = field(default_factory=dict)
    group_id: str | None = None
    dedup_id: str | None = None

    def header(self) -> dict[str, Any]:
        h: dict[str, Any] = {}
        if self.attributes:
            h["MessageAttributes"] = self.attributes
        if self.system_attributes:
            h["MessageSystemAttributes"] = self.system_attributes
        if self.group_id is not None:
            h["MessageGroupId"] = self.group_id
        if self.dedup_id is not None:
            h["MessageDeduplicationId"] = self.dedup_id
        return h


def encode(msg: Stored) -> bytes:
    """The item value for ``msg``: the plain body unless there is more to keep."""
    body = msg.body.encode()
    header = msg.header()
    if not header:
        return body
    raw = json.dumps(header, separators=(",", ":"), sort_keys=True).encode()
    return MAGIC + _LEN.pack(len(raw)) + raw + body


def decode(value: bytes) -> Stored:
    """The message an item's value holds (any value: native ones too)."""
    if value.startswith(MAGIC):
        parsed = _parse_envelope(value)
        if parsed is not None:
            return parsed
    try:
        return Stored(value.decode())
    except UnicodeDecodeError:
        text = base64.b64encode(value).decode()
        return Stored(text, {ENCODING_ATTRIBUTE: {"DataType": "String", "StringValue": "base64"}})


def _parse_envelope(value: bytes) -> Stored | None:
    """``None`` when the bytes only look like an envelope (a native binary value).

    The header is checked as a sent message's attributes are: a native value can hold
    anything after the magic, and an attribute of the wrong shape would fail every
    receive that meets it (and hide the messages received with it)."""
    try:
        (n,) = _LEN.unpack_from(value, len(MAGIC))
        start = len(MAGIC) + _LEN.size
        header = json.loads(value[start : start + n])
        body = value[start + n :].decode()
        if not isinstance(header, dict):
            return None
        ids = header.get("MessageGroupId"), header.get("MessageDeduplicationId")
        if not all(i is None or isinstance(i, str) for i in ids):
            return None
        return Stored(
            body,
            _stored_attributes(header.get("MessageAttributes", {})),
            _stored_attributes(header.get("MessageSystemAttributes", {})),
            *ids,
        )
    except (struct.error, ValueError, UnicodeDecodeError, TypeError, SqsError):
        return None


def _stored_attributes(raw: object) -> Attributes:
    if not isinstance(raw, dict):
        raise TypeError("attributes are not a map")
    return {name: _check_value(name, a, "stored attribute") for name, a in raw.items()}


def md5_hex(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _value_bytes(a: dict[str, str]) -> tuple[int, bytes]:
    """(transport type, value bytes) of one attribute."""
    if a["DataType"].startswith("Binary"):
        return 2, base64.b64decode(a["BinaryValue"])
    return 1, a["StringValue"].encode()


def md5_of_attributes(attrs: Attributes) -> str:
    """SQS's ``MD5OfMessageAttributes`` (also ``MD5OfMessageSystemAttributes``)."""
    out = bytearray()
    for name in sorted(attrs):
        a = attrs[name]
        kind, value = _value_bytes(a)
        for part in (name.encode(), a["DataType"].encode()):
            out += _LEN.pack(len(part)) + part
        out.append(kind)
        out += _LEN.pack(len(value)) + value
    return md5_hex(bytes(out))


def attributes_size(attrs: Attributes) -> int:
    """Bytes counted against the message size limit: names, types and values."""
    return sum(
        len(name.encode()) + len(a["DataType"].encode()) + len(_value_bytes(a)[1])
        for name, a in attrs.items()
    )


def check_text(text: object, what: str, shape: str = "InvalidMessageContents") -> str:
    """``text`` if it holds only characters SQS allows (XML 1.0's, which the query
    protocol's answers can carry), else ``shape`` (queue tags and attributes use it too)."""
    if not isinstance(text, str):
        raise SqsError("InvalidParameterValue", f"{what} must be a string.")
    bad = _BAD_CHAR.search(text)
    if bad is not None:
        raise SqsError(
            shape,
            f"Invalid characters found in {what}: U+{ord(bad.group()):04X} is not allowed.",
        )
    return text


def check_attributes(raw: object, *, system: bool = False, relaxed: bool = False) -> Attributes:
    """Validated attributes in the wire's JSON form (binary values stay base64)."""
    if raw is None:
        return {}
    kind = "message system attribute" if system else "message attribute"
    if not isinstance(raw, dict):
        raise SqsError("InvalidParameterValue", f"The {kind}s must be a map.")
    if not relaxed and len(raw) > MAX_ATTRIBUTES:
        raise SqsError(
            "InvalidParameterValue",
            f"Number of {kind}s [{len(raw)}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].",
        )
    out: Attributes = {}
    for name, a in raw.items():
        if system:
            if name != "AWSTraceHeader":
                raise SqsError(
                    "InvalidParameterValue", f"Message system attribute name '{name}' is invalid."
                )
        else:
            _check_name(name)
        out[name] = _check_value(name, a, kind)
    return out


def _check_name(name: object) -> None:
    ok = (
        isinstance(name, str)
        and _ATTR_NAME.fullmatch(name) is not None
        and not name.startswith(".")
        and not name.endswith(".")
        and ".." not in name
        and not name.lower().startswith(("aws.", "amazon."))
    )
    if not ok:
        raise SqsError("InvalidParameterValue", f"Message attribute name '{name}' is invalid.")


def _check_value(name: str, a: object, kind: str) -> dict[str, str]:
    if not isinstance(a, dict):
        raise SqsError("InvalidParameterValue", f"The {kind} '{name}' must be a structure.")
    dtype = a.get("DataType")
    if not isinstance(dtype, str) or _DATA_TYPE.fullmatch(dtype) is None:
        raise SqsError(
            "InvalidParameterValue",
            f"The {kind} '{name}' has an invalid message attribute type, the set of supported "
            "type prefixes is Binary, Number, and String.",
        )
    if dtype.startswith("Binary"):
        value = a.get("BinaryValue")
        if not isinstance(value, str) or not value:
            raise SqsError(
                "InvalidParameterValue",
                f"The {kind} '{name}' with type 'Binary' must use field 'Binary'.",
            )
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise SqsError(
                "InvalidParameterValue",
                f"The {kind} '{name}' has a BinaryValue that is not base64.",
            ) from None
        return {"DataType": dtype, "BinaryValue": value}
    text = a.get("StringValue")
    if not isinstance(text, str) or not text:
        raise SqsError(
            "InvalidParameterValue",
            f"The {kind} '{name}' must contain a non-empty message attribute value for "
            f"message attribute type '{dtype.split('.')[0]}'.",
        )
    check_text(text, f"the {kind} '{name}'")
    if dtype.startswith("Number"):
        try:
            number = Decimal(text)
        except InvalidOperation:
            number = Decimal("NaN")
        if not number.is_finite():
            raise SqsError(
                "InvalidParameterValue",
                f"Can't cast the value of {kind} '{name}' to a number.",
            )
    return {"DataType": dtype, "StringValue": text}


def message_id(queue: str, item_id: int) -> str:
    """A stable UUID-shaped id for item ``item_id`` of ``queue`` (same on every delivery).

    The first 16 hex digits come from the queue name, the last 16 are the item id, so
    ids of different queues differ and the item id can be read back.
    """
    h = hashlib.sha1(queue.encode(), usedforsecurity=False).hexdigest()
    i = f"{item_id:016x}"
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{i[0:4]}-{i[4:16]}"
