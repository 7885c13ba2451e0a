"""Entry encoding: the original design's EntryKey(128), Stats(128), pending and tombstone entries.

Byte-by-byte specification: ``docs/format.md`` ("Entries"). Everything here is
big-endian so that the byte order of an encoded key equals key order: a segment
or memory table sorted by ``bytes`` is sorted by (deadline, id, type).

    EntryKey(128) = reserved(14) | deadline(48) | id(64) | type(2)
    Stats(128)    = enqueue_time(48) | requeue_time(48) | dequeue_count(32)
    pending       = key(16) stats(16) value_length(u32) value
    tombstone     = key(16)

A tombstone's key equals its pending entry's key with type ``11``, so in key
order a tombstone sorts immediately after the entry it cancels; that adjacency is
what lets a merged view cancel pairs without any lookup.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from dq.storage.errors import CorruptionError

__all__ = [
    "KEY_SIZE",
    "MAX_DEADLINE",
    "MAX_ID",
    "PENDING",
    "PENDING_HEADER",
    "STATS_SIZE",
    "TOMBSTONE",
    "decode_key",
    "decode_stats",
    "encode_key",
    "encode_pending",
    "encode_stats",
    "iter_entries",
    "key_deadline",
    "key_id",
    "tombstone_of",
]

KEY_SIZE = 16
STATS_SIZE = 16
PENDING = 0b00
TOMBSTONE = 0b11
MAX_DEADLINE = (1 << 48) - 1
MAX_ID = (1 << 64) - 1
_MASK64 = (1 << 64) - 1

#: key(16) + stats(16) + value_length(u32)
PENDING_HEADER = struct.Struct(">16s16sI")
assert PENDING_HEADER.size == 36
_VALUE_LENGTH = struct.Struct(">I")
assert _VALUE_LENGTH.size == 4


def encode_key(deadline: int, item_id: int, kind: int = PENDING) -> bytes:
    """EntryKey(128): reserved bits zero, then deadline, id and type, big-endian."""
    return ((deadline << 66) | (item_id << 2) | kind).to_bytes(16, "big")


def decode_key(key: bytes) -> tuple[int, int, int]:
    """Return (deadline, id, type); reject keys whose reserved bits are set."""
    n = int.from_bytes(key, "big")
    if n >> 114:
        raise CorruptionError("entry key has reserved bits set", key=key.hex())
    return (n >> 66) & MAX_DEADLINE, (n >> 2) & _MASK64, n & 0b11


def key_deadline(key: bytes) -> int:
    return int.from_bytes(key[:8], "big") >> 2 & MAX_DEADLINE


def key_id(key: bytes) -> int:
    return (int.from_bytes(key, "big") >> 2) & _MASK64


def tombstone_of(key: bytes) -> bytes:
    """The tombstone key that cancels the pending entry ``key``."""
    return key[:15] + bytes((key[15] | TOMBSTONE,))


def encode_stats(enqueue_time: int, requeue_time: int, dequeue_count: int) -> bytes:
    return ((enqueue_time << 80) | (requeue_time << 32) | dequeue_count).to_bytes(16, "big")


def decode_stats(stats: bytes) -> tuple[int, int, int]:
    n = int.from_bytes(stats, "big")
    return n >> 80, (n >> 32) & MAX_DEADLINE, n & 0xFFFFFFFF


def encode_pending(key: bytes, stats: bytes, value: bytes) -> bytes:
    return PENDING_HEADER.pack(key, stats, len(value)) + value


def iter_entries(
    buf: bytes | memoryview, *, where: str = "<buffer>", base: int = 0
) -> Iterator[tuple[bytes, bytes | None, bytes | None, int]]:
    """Yield (key, stats, value, offset) for each entry; stats/value are None for tombstones.

    ``where`` and ``base`` only make corruption errors name the file and offset.
    """
    view = memoryview(buf)
    end = len(view)
    pos = 0
    unpack = PENDING_HEADER.unpack_from
    while pos < end:
        if end - pos < KEY_SIZE:
            raise CorruptionError("truncated entry key", file=where, offset=base + pos)
        kind = view[pos + 15] & 0b11
        if view[pos] & 0b11111100:
            raise CorruptionError("entry key has reserved bits set", file=where, offset=base + pos)
        if kind == TOMBSTONE:
            yield bytes(view[pos : pos + KEY_SIZE]), None, None, pos
            pos += KEY_SIZE
        elif kind == PENDING:
            if end - pos < PENDING_HEADER.size:
                raise CorruptionError("truncated entry header", file=where, offset=base + pos)
            key, stats, length = unpack(view, pos)
            start = pos + PENDING_HEADER.size
            if start + length > end:
                raise CorruptionError(
                    "entry value runs past its block", file=where, offset=base + pos
                )
            yield key, stats, bytes(view[start : start + length]), pos
            pos = start + length
        else:
            raise CorruptionError(
                f"entry type {kind:02b} is reserved", file=where, offset=base + pos
            )
