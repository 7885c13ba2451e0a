"""What the command ring's ``key``, ``value`` and response body mean for each op, as a
client writes commands and reads answers.

Owns the client's side of the per-op field encodings of ``docs/shm.md`` ("Command ring",
op table); the slot layout itself is ``shm/command_ring.py``. The server's side — decoding
a command, encoding its answer — is compiled (``shm/_session.c``), and the tests hold the
two to the same table. Pure functions, used by the client transport and the tests.
Invariant: every decoder checks lengths and ranges and raises ``MalformedSlot`` rather
than ``struct.error`` or ``IndexError``.

    op        key (16 bytes)                     value                      ok body
    PUT       deadline u64 | delay_ms u64        item value (<= 1024)       id u64 | deadline u64
    DELETE    id u64 | 0                         receipt (ASCII)            empty
    FIND      count u32 | wait_ms u32 | lease_ms u64   empty               count u32, deliveries
                                                                            (with FLAG_GROUPS:
                                                                            each with its group)
    REQUEUE   id u64 | deadline u64              delay_ms u64 | receipt     deadline u64
    EXTEND    id u64 | lease_ms u64              receipt                    lease_expires u64 |
                                                                            receipt_len u16 | receipt
    STATS     0                                  empty                      JSON object
    BIND      0                                  queue name (ASCII)         empty
    CONTINUE  0                                  empty                      next chunk
    PART      0                                  the next piece of the following command's body
    PUT_MANY  count u32 | body_size u32 |        count x (deadline u64 | delay_ms u64 |
              flags u64 (bit 0 REPLACE)          value_len u32 | key_len u8 | key | value)
                                                 ok body: count x (id u64 | deadline u64 |
                                                 how u8: 0 new, 1 duplicate, 2 replaced)
    DELETE_MANY  count u32 | body_size u32 | 0   count x (id u64 | receipt_len u16 | receipt)
                                                 ok body: count x status u8, then per
                                                 failed item message_len u16 | message

A zero deadline, delay, count or lease means "not given" (count 0 means 1).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from dq.shm.command_ring import FLAG_GROUPS
from dq.shm.errors import MalformedSlot
from dq.storage.types import Delivery, ItemStats

__all__ = [
    "DELIVERY_HEAD",
    "DELIVERY_HEAD_GROUPS",
    "PUT_MANY_REPLACE",
    "decode_delete_many_ok",
    "decode_deliveries",
    "decode_extend_ok",
    "decode_put_many_ok",
    "decode_put_ok",
    "decode_u64",
    "delivery_fields",
    "encode_delete_many",
    "encode_extend",
    "encode_find",
    "encode_item",
    "encode_put",
    "encode_put_many",
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
#: the head of a delivery in an answer with FLAG_GROUPS: the same, then group_len u8
DELIVERY_HEAD_GROUPS = struct.Struct("<QQQQQIHIB")
MANY_KEY = struct.Struct("<IIQ")  # count, body_size, flags (PUT_MANY; else 0)
PUT_MANY_ITEM = struct.Struct("<QQIB")  # deadline, delay_ms, value_len, key_len
PUT_MANY_OK = struct.Struct("<QQB")  # id, deadline, how (0 new, 1 duplicate, 2 replaced)
#: PUT_MANY flag: each item with a key replaces the pending item of its key
#: (``on_duplicate`` "replace", ``storage/dedup.py``) instead of answering a duplicate
PUT_MANY_REPLACE = 1
DELETE_MANY_ITEM = struct.Struct("<QH")  # id, receipt_len
assert KEY2.size == FIND_KEY.size == MANY_KEY.size == 16
assert (PUT_MANY_ITEM.size, PUT_MANY_OK.size, DELETE_MANY_ITEM.size) == (21, 17, 10)
assert (DELIVERY_HEAD.size, DELIVERY_HEAD_GROUPS.size) == (50, 51)


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


def decode_put_ok(body: bytes) -> tuple[int, int]:
    if len(body) != 16:
        raise MalformedSlot("PUT response must be 16 bytes", size=len(body))
    item_id, deadline = KEY2.unpack(body)
    return int(item_id), int(deadline)


# ---- FIND ------------------------------------------------------------------------------


def encode_find(count: int, wait_ms: int, lease_ms: int | None) -> bytes:
    return FIND_KEY.pack(count, wait_ms, _u64(lease_ms))


def decode_deliveries(body: bytes, flags: int = 0) -> list[Delivery]:
    """A FIND body's deliveries; ``flags``: its answer's (``FLAG_GROUPS``: with groups)."""
    return [
        Delivery(i, receipt, value, dl, ItemStats(enq, req, dq), exp, group)
        for i, receipt, value, dl, enq, req, dq, exp, group in delivery_fields(body, flags)
    ]


def _group(raw: bytes) -> str:
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise MalformedSlot("group is not ASCII") from None


def delivery_fields(
    body: bytes, flags: int = 0
) -> list[tuple[int, str, bytes, int, int, int, int, int, str | None]]:
    """A FIND body's deliveries as (id, receipt, value, deadline, enqueue_time,
    requeue_time, dequeue_count, lease_expires, group): each side builds its own objects.
    The answer's ``flags`` say the layout: with ``FLAG_GROUPS`` each delivery has
    ``group_len`` after ``value_len`` and its group after its value; without it (a server
    that does not send groups, or a client that did not ask) there is none, and ``group``
    is None, as for an item without a group."""
    if len(body) < 4:
        raise MalformedSlot("FIND response too short", size=len(body))
    (count,) = U32.unpack_from(body)
    pos = 4
    end = len(body)
    groups = bool(flags & FLAG_GROUPS)
    out: list[tuple[int, str, bytes, int, int, int, int, int, str | None]] = []
    if not groups:
        unpack, head = DELIVERY_HEAD.unpack_from, DELIVERY_HEAD.size
        for _ in range(count):
            if pos + head > end:
                raise MalformedSlot("FIND response truncated", offset=pos)
            i, dl, exp, enq, req, dq, rlen, vlen = unpack(body, pos)
            pos += head
            if pos + rlen + vlen > end:
                raise MalformedSlot("FIND response truncated", offset=pos)
            receipt = _receipt(body[pos : pos + rlen])
            value = body[pos + rlen : pos + rlen + vlen]
            pos += rlen + vlen
            out.append((i, receipt, value, dl, enq, req, dq, exp, None))
        return out
    unpack, head = DELIVERY_HEAD_GROUPS.unpack_from, DELIVERY_HEAD_GROUPS.size
    for _ in range(count):
        if pos + head > end:
            raise MalformedSlot("FIND response truncated", offset=pos)
        i, dl, exp, enq, req, dq, rlen, vlen, glen = unpack(body, pos)
        pos += head
        if pos + rlen + vlen + glen > end:
            raise MalformedSlot("FIND response truncated", offset=pos)
        receipt = _receipt(body[pos : pos + rlen])
        value = body[pos + rlen : pos + rlen + vlen]
        pos += rlen + vlen
        group = _group(body[pos : pos + glen]) if glen else None
        pos += glen
        out.append((i, receipt, value, dl, enq, req, dq, exp, group))
    return out


# ---- DELETE / REQUEUE / EXTEND -----------------------------------------------------------


def encode_item(item_id: int, receipt: str, arg: int | None = None) -> tuple[bytes, bytes]:
    """DELETE (arg unused) and EXTEND (arg = lease_ms): key and value."""
    return KEY2.pack(item_id, _u64(arg)), receipt.encode("ascii")


def encode_requeue(
    item_id: int, receipt: str, deadline: int | None, delay_ms: int | None
) -> tuple[bytes, bytes]:
    return KEY2.pack(item_id, _u64(deadline)), U64.pack(_u64(delay_ms)) + receipt.encode("ascii")


def encode_extend(item_id: int, receipt: str, lease_ms: int) -> tuple[bytes, bytes]:
    return encode_item(item_id, receipt, lease_ms)


def decode_extend_ok(body: bytes) -> tuple[int, str]:
    if len(body) < 10:
        raise MalformedSlot("EXTEND response too short", size=len(body))
    (expires,) = U64.unpack_from(body)
    (rlen,) = U16.unpack_from(body, 8)
    if 10 + rlen != len(body):
        raise MalformedSlot("EXTEND response length mismatch", size=len(body))
    return int(expires), _receipt(body[10:])


# ---- PUT_MANY / DELETE_MANY: a batch in one command -----------------------------------------


def _many_key(count: int, body: bytes, flags: int = 0) -> bytes:
    return MANY_KEY.pack(count, len(body), flags)


def encode_put_many(
    items: Sequence[tuple[bytes, int | None, int | None, str | None]],
    replace: bool = False,
) -> tuple[bytes, bytes]:
    """Key and body of a PUT_MANY: ``items`` are (value, deadline, delay_ms, key);
    ``replace``: each item with a key replaces its key's pending item (flag REPLACE).
    ``ValueError`` for a key the ring cannot carry: empty (length 0 means no key) or
    over 255 bytes (its length is a u8)."""
    parts = []
    for value, deadline, delay_ms, dedup in items:
        raw_key = b"" if dedup is None else dedup.encode("utf-8")
        if len(raw_key) > 255 or (dedup is not None and not raw_key):
            raise ValueError("the ring carries idempotency keys of 1-255 bytes")
        parts.append(PUT_MANY_ITEM.pack(_u64(deadline), _u64(delay_ms), len(value), len(raw_key)))
        parts.append(raw_key)
        parts.append(value)
    body = b"".join(parts)
    return _many_key(len(items), body, PUT_MANY_REPLACE if replace else 0), body


def decode_put_many_ok(body: bytes, count: int) -> list[tuple[int, int, bool, bool]]:
    """(id, deadline, duplicate, replaced) of each item."""
    if len(body) != count * PUT_MANY_OK.size:
        raise MalformedSlot("PUT_MANY response length mismatch", size=len(body), count=count)
    out = []
    for i, dl, how in PUT_MANY_OK.iter_unpack(body):
        if how > 2:
            raise MalformedSlot("PUT_MANY answer says neither new, duplicate nor replaced")
        out.append((i, dl, how == 1, how == 2))
    return out


def encode_delete_many(items: Sequence[tuple[int, str]]) -> tuple[bytes, bytes]:
    """Key and body of a DELETE_MANY: ``items`` are (id, receipt), receipts ASCII."""
    parts = []
    for item_id, receipt in items:
        raw = receipt.encode("ascii")
        parts.append(DELETE_MANY_ITEM.pack(item_id, len(raw)))
        parts.append(raw)
    body = b"".join(parts)
    return _many_key(len(items), body), body


def decode_delete_many_ok(body: bytes, count: int) -> list[tuple[int, str]]:
    """(status, message) per item; message empty for the released ones."""
    if len(body) < count:
        raise MalformedSlot("DELETE_MANY response too short", size=len(body), count=count)
    out = []
    pos = count
    for status in body[:count]:
        message = ""
        if status:
            if pos + 2 > len(body):
                raise MalformedSlot("DELETE_MANY response truncated", offset=pos)
            (mlen,) = U16.unpack_from(body, pos)
            pos += 2
            if pos + mlen > len(body):
                raise MalformedSlot("DELETE_MANY response truncated", offset=pos)
            message = body[pos : pos + mlen].decode("utf-8", "replace")
            pos += mlen
        out.append((status, message))
    if pos != len(body):
        raise MalformedSlot("DELETE_MANY response longer than its items", size=len(body))
    return out
