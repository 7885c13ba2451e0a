"""What the command ring's ``key``, ``value`` and response body mean for each op.

Owns the per-op field encodings of ``docs/shm.md`` ("Command ring", op table); the slot
layout itself is ``shm/command_ring.py``. Pure functions, used by the server's handler and
the client transport alike. Invariant: every decoder checks lengths and ranges and raises
``MalformedSlot`` rather than ``struct.error`` or ``IndexError``.

    op        key (16 bytes)                     value                      ok body
    PUT       deadline u64 | delay_ms u64        item value (<= 1024)       id u64 | deadline u64
    DELETE    id u64 | 0                         receipt (ASCII)            empty
    FIND      count u32 | wait_ms u32 | lease_ms u64   empty               count u32, deliveries
    REQUEUE   id u64 | deadline u64              delay_ms u64 | receipt     deadline u64
    EXTEND    id u64 | lease_ms u64              receipt                    lease_expires u64 |
                                                                            receipt_len u16 | receipt
    STATS     0                                  empty                      JSON object
    BIND      0                                  queue name (ASCII)         empty
    CONTINUE  0                                  empty                      next chunk

A zero deadline, delay, count or lease means "not given" (count 0 means 1).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from dq.shm.errors import MalformedSlot
from dq.storage.types import Delivery, ItemStats

__all__ = [
    "DELIVERY_HEAD",
    "FindArgs",
    "ItemArgs",
    "decode_deliveries",
    "decode_extend_ok",
    "decode_find",
    "decode_item",
    "decode_put",
    "decode_put_ok",
    "decode_requeue",
    "decode_u64",
    "encode_deliveries",
    "encode_extend",
    "encode_extend_ok",
    "encode_find",
    "encode_item",
    "encode_put",
    "encode_put_ok",
    "encode_requeue",
    "encode_u64",
]

KEY2 = struct.Struct("<QQ")
FIND_KEY = struct.Struct("<IIQ")
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
# id, deadline, lease_expires, enqueue_time, requeue_time, dequeue_count, receipt_len, value_len
DELIVERY_HEAD = struct.Struct("<QQQQQIHI")
assert KEY2.size == FIND_KEY.size == 16
assert DELIVERY_HEAD.size == 50


def _opt(v: int) -> int | None:
    return v if v else None


def _u64(v: int | None) -> int:
    return 0 if v is None else v


def encode_u64(v: int) -> bytes:
    return U64.pack(v)


def decode_u64(body: bytes) -> int:
    if len(body) < 8:
        raise MalformedSlot("body too short for a u64", size=len(body))
    return int(U64.unpack_from(body)[0])


def _receipt(raw: bytes) -> str:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedSlot("receipt is not ASCII") from None
    if not text:
        raise MalformedSlot("receipt is empty")
    return text


# ---- PUT -------------------------------------------------------------------------------


def encode_put(deadline: int | None, delay_ms: int | None) -> bytes:
    return KEY2.pack(_u64(deadline), _u64(delay_ms))


def decode_put(key: bytes) -> tuple[int | None, int | None]:
    deadline, delay = KEY2.unpack(key)
    return _opt(deadline), _opt(delay)


def encode_put_ok(item_id: int, deadline: int) -> bytes:
    return KEY2.pack(item_id, deadline)


def decode_put_ok(body: bytes) -> tuple[int, int]:
    if len(body) != 16:
        raise MalformedSlot("PUT response must be 16 bytes", size=len(body))
    item_id, deadline = KEY2.unpack(body)
    return int(item_id), int(deadline)


# ---- FIND ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindArgs:
    count: int
    wait_ms: int
    lease_ms: int | None


def encode_find(count: int, wait_ms: int, lease_ms: int | None) -> bytes:
    return FIND_KEY.pack(count, wait_ms, _u64(lease_ms))


def decode_find(key: bytes) -> FindArgs:
    count, wait_ms, lease = FIND_KEY.unpack(key)
    return FindArgs(max(count, 1), wait_ms, _opt(lease))


def encode_deliveries(deliveries: Sequence[Delivery]) -> bytes:
    parts = [U32.pack(len(deliveries))]
    for d in deliveries:
        receipt = d.receipt.encode("ascii")
        parts.append(
            DELIVERY_HEAD.pack(
                d.id,
                d.deadline,
                d.lease_expires,
                d.stats.enqueue_time,
                d.stats.requeue_time,
                d.stats.dequeue_count,
                len(receipt),
                len(d.value),
            )
        )
        parts.append(receipt)
        parts.append(d.value)
    return b"".join(parts)


def decode_deliveries(body: bytes) -> list[Delivery]:
    if len(body) < 4:
        raise MalformedSlot("FIND response too short", size=len(body))
    (count,) = U32.unpack_from(body)
    pos = 4
    out: list[Delivery] = []
    for _ in range(count):
        if pos + DELIVERY_HEAD.size > len(body):
            raise MalformedSlot("FIND response truncated", offset=pos)
        i, dl, exp, enq, req, dq, rlen, vlen = DELIVERY_HEAD.unpack_from(body, pos)
        pos += DELIVERY_HEAD.size
        if pos + rlen + vlen > len(body):
            raise MalformedSlot("FIND response truncated", offset=pos)
        receipt = _receipt(body[pos : pos + rlen])
        value = body[pos + rlen : pos + rlen + vlen]
        pos += rlen + vlen
        out.append(Delivery(i, receipt, value, dl, ItemStats(enq, req, dq), exp))
    return out


# ---- DELETE / REQUEUE / EXTEND -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ItemArgs:
    id: int
    arg: int | None  # REQUEUE: deadline; EXTEND: lease_ms; DELETE: unused
    receipt: str
    delay_ms: int | None = None  # REQUEUE only


def encode_item(item_id: int, receipt: str, arg: int | None = None) -> tuple[bytes, bytes]:
    """DELETE (arg unused) and EXTEND (arg = lease_ms): key and value."""
    return KEY2.pack(item_id, _u64(arg)), receipt.encode("ascii")


def decode_item(key: bytes, value: bytes) -> ItemArgs:
    item_id, arg = KEY2.unpack(key)
    return ItemArgs(item_id, _opt(arg), _receipt(value))


def encode_requeue(
    item_id: int, receipt: str, deadline: int | None, delay_ms: int | None
) -> tuple[bytes, bytes]:
    return KEY2.pack(item_id, _u64(deadline)), U64.pack(_u64(delay_ms)) + receipt.encode("ascii")


def decode_requeue(key: bytes, value: bytes) -> ItemArgs:
    item_id, deadline = KEY2.unpack(key)
    if len(value) < 8:
        raise MalformedSlot("REQUEUE value must start with delay_ms u64", size=len(value))
    (delay,) = U64.unpack_from(value)
    return ItemArgs(item_id, _opt(deadline), _receipt(value[8:]), _opt(delay))


def encode_extend(item_id: int, receipt: str, lease_ms: int) -> tuple[bytes, bytes]:
    return encode_item(item_id, receipt, lease_ms)


def encode_extend_ok(lease_expires: int, receipt: str) -> bytes:
    raw = receipt.encode("ascii")
    return U64.pack(lease_expires) + U16.pack(len(raw)) + raw


def decode_extend_ok(body: bytes) -> tuple[int, str]:
    if len(body) < 10:
        raise MalformedSlot("EXTEND response too short", size=len(body))
    (expires,) = U64.unpack_from(body)
    (rlen,) = U16.unpack_from(body, 8)
    if 10 + rlen != len(body):
        raise MalformedSlot("EXTEND response length mismatch", size=len(body))
    return int(expires), _receipt(body[10:])
