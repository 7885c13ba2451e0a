"""The WPOL submission ring (docs/shm.md): many producer processes, one consumer (the server).

Owns the byte layout and the lock-free protocol of docs/shm.md ("Submission ring").
The layout is the original design's byte for byte: a 64-byte header, ``capacity`` u64 ring entries
(``priority << 32 | slot index``, 0 = empty) and ``capacity`` 64-byte task slots on a
CAS free list; we add a payload area after the slots and use header and slot bytes the
original design leaves unassigned. The protocol is the original design's with the fixes that
``shm/model/wpol.py`` checks under every interleaving:

  - push: entry CAS, then tail CAS ``t -> t+1`` (never a blind increment); a written
    entry at the tail is helped past instead of reported as "full"; a failed tail CAS
    raises the scan flag (the entry may have landed a lap ahead);
  - pop (one consumer only): clear the entry, then publish the head; skip empty entries
    below the tail; when empty, help the tail and, on the scan flag, skip the tail to a
    written entry ahead;
  - free list: the u32 head at offset 48 plus a u32 ABA tag at 52, CASed as one u64.

Invariant kept: every pushed entry is popped exactly once, whatever a producer's speed or
death; hostile bytes raise ``ShmError`` subclasses, never anything else.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Any

from dq.shm import _atomics as A
from dq.shm.errors import ProtocolError, RingFullError

__all__ = [
    "ENTRY_OFF",
    "FREE",
    "HEADER",
    "HEADER_SIZE",
    "MAGIC",
    "NO_SLOT",
    "SLOT",
    "SLOT_SIZE",
    "VERSION",
    "BadMagic",
    "Geometry",
    "SubmissionRing",
    "VersionMismatch",
    "init_ring",
    "read_geometry",
    "ring_size",
]

MAGIC = 0x57504F4C  # "WPOL"
VERSION = 1
NO_SLOT = 0xFFFFFFFF  # the original design's empty free list

# magic, version, head, tail, capacity, mask, allocated, server pid*, slots base,
# payload bytes per slot*, free-list head, free-list tag*, scan flag*, drainer asleep*
# (* = ours, in bytes the original design leaves unassigned)
HEADER = struct.Struct("<IIQQIIIIIIIIII")
HEADER_SIZE = 64
assert HEADER.size == HEADER_SIZE
OFF_HEAD, OFF_TAIL, OFF_ALLOCATED, OFF_SERVER_PID = 8, 16, 32, 36
OFF_FREE, OFF_SCAN, OFF_ASLEEP = 48, 56, 60
ENTRY_OFF = HEADER_SIZE

# state, next free / task id, priority, value length*, timestamp (deadline or delay ms),
# method, reference count, owner pid*, waiting*, queue-name length*, error*, reserved*,
# item id*, stored deadline*
SLOT = struct.Struct("<IIIIQIIIIHHIQQ")
SLOT_SIZE = 64
assert SLOT.size == SLOT_SIZE
S_STATE, S_NEXT, S_PRIORITY, S_REFS, S_OWNER, S_WAITING = 0, 4, 8, 28, 32, 36
S_ERROR, S_ID, S_DEADLINE = 42, 48, 56
RESULT = struct.Struct("<QQ")  # item id, stored deadline at slot offset 48

# slot states: the original design's 0 and 1, then ours
FREE, ALLOCATED, SUBMITTED, DONE, FAILED = 0, 1, 2, 3, 4
# methods: what the timestamp means
ENQUEUE_AT, ENQUEUE_AFTER = 1, 2
PRIORITY = 1  # FIFO ring; priority 1 keeps slot 0's entry non-zero

MAX_SPINS = 1 << 16  # a CAS loop that loses this often is facing a hostile writer


class BadMagic(ProtocolError):
    """The original design's "invalid memory": magic != 0x57504F4C."""


class VersionMismatch(ProtocolError):
    """The original design's "version mismatch": version != 1."""


@dataclass(frozen=True, slots=True)
class Geometry:
    capacity: int
    payload_size: int
    slots_base: int
    payload_base: int
    size: int


def ring_size(capacity: int, payload_size: int) -> int:
    return HEADER_SIZE + capacity * (8 + SLOT_SIZE + payload_size)


def init_ring(buf: Any, capacity: int, payload_size: int) -> Geometry:
    """The original design's initialization protocol, magic written last. Re-initializes always
    (the server owns the ring and calls this on a fresh or corrupted object)."""
    if capacity < 2 or capacity & (capacity - 1) or capacity > 1 << 20:
        raise ValueError("capacity must be a power of two in [2, 2**20]")
    if payload_size < 136 or payload_size % 8:
        raise ValueError("payload_size must be a multiple of 8 and >= 136")
    size = ring_size(capacity, payload_size)
    if len(buf) < size:
        raise ValueError(f"buffer of {len(buf)} bytes is smaller than the ring ({size})")
    A.store_u32(buf, 0, 0)  # invalidate first: attachers wait for the magic
    slots_base = HEADER_SIZE + capacity * 8
    HEADER.pack_into(
        buf, 0, 0, VERSION, 0, 0, capacity, capacity - 1, 0, os.getpid(), slots_base,
        payload_size, 0, 0, 0, 0,
    )  # fmt: skip
    for i in range(capacity):
        nxt = i + 1 if i + 1 < capacity else NO_SLOT
        SLOT.pack_into(
            buf, slots_base + i * SLOT_SIZE, FREE, nxt, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
        )
    buf[ENTRY_OFF:slots_base] = bytes(capacity * 8)
    A.fence()
    A.store_u32(buf, 0, MAGIC)
    return read_geometry(buf)


def read_geometry(buf: Any) -> Geometry:
    """Check the header the way the original design's error table says; raise on anything off."""
    if len(buf) < HEADER_SIZE:
        raise ProtocolError("buffer too small for the WPOL header", size=len(buf))
    magic = A.load_u32(buf, 0)
    if magic != MAGIC:
        raise BadMagic("not a WPOL submission ring", magic=hex(magic))
    fields = HEADER.unpack_from(buf, 0)
    version, capacity, mask, slots_base, payload = (
        fields[1],
        fields[4],
        fields[5],
        fields[8],
        fields[9],
    )
    if version != VERSION:
        raise VersionMismatch("unsupported WPOL version", version=version)
    if capacity < 2 or capacity & (capacity - 1) or mask != capacity - 1:
        raise ProtocolError("bad capacity or mask", capacity=capacity, mask=mask)
    if slots_base != HEADER_SIZE + capacity * 8 or payload < 136 or payload % 8:
        raise ProtocolError("bad slots base or payload size", slots_base=slots_base)
    size = ring_size(capacity, payload)
    if len(buf) < size:
        raise ProtocolError("ring larger than its buffer", size=size, buffer=len(buf))
    return Geometry(capacity, payload, slots_base, slots_base + capacity * SLOT_SIZE, size)


class SubmissionRing:
    """The ring's operations on one mapped buffer (producer and consumer sides)."""

    def __init__(self, buf: Any) -> None:
        self.buf = buf
        self.geo = g = read_geometry(buf)
        self.capacity = g.capacity
        self.mask = g.capacity - 1

    # ---- slots -----------------------------------------------------------------------

    def slot_off(self, index: int) -> int:
        return self.geo.slots_base + index * SLOT_SIZE

    def payload_off(self, index: int) -> int:
        return self.geo.payload_base + index * self.geo.payload_size

    def allocate(self) -> int | None:
        """Original "slot allocation" with a tagged head; None when no slot is free."""
        buf, cap = self.buf, self.capacity
        for _ in range(MAX_SPINS):
            word = A.load_u64(buf, OFF_FREE)
            index = word & 0xFFFFFFFF
            if index == NO_SLOT:
                return None
            if index >= cap:
                raise ProtocolError("free-list head out of range", index=index)
            nxt = A.load_u32(buf, self.slot_off(index) + S_NEXT)
            new = ((word >> 32) + 1 & 0xFFFFFFFF) << 32 | nxt
            if nxt != NO_SLOT and nxt >= cap:
                if A.load_u64(buf, OFF_FREE) == word:
                    raise ProtocolError("free list links out of range", index=index, next=nxt)
                continue
            if A.cas_u64(buf, OFF_FREE, word, new):
                off = self.slot_off(index)
                A.store_u32(buf, off + S_STATE, ALLOCATED)
                A.store_u32(buf, off + S_REFS, 1)
                A.store_u32(buf, off + S_OWNER, os.getpid())
                A.fetch_add_u32(buf, OFF_ALLOCATED, 1)
                return index
        raise RingFullError("free list under constant contention", spins=MAX_SPINS)

    def free(self, index: int) -> None:
        """Original "slot deallocation" with a tagged head."""
        if not 0 <= index < self.capacity:
            raise ProtocolError("slot index out of range", index=index)
        buf, off = self.buf, self.slot_off(index)
        A.store_u32(buf, off + S_REFS, 0)
        for _ in range(MAX_SPINS):
            word = A.load_u64(buf, OFF_FREE)
            A.store_u32(buf, off + S_NEXT, word & 0xFFFFFFFF)
            A.store_u32(buf, off + S_STATE, FREE)
            if A.cas_u64(buf, OFF_FREE, word, ((word >> 32) + 1 & 0xFFFFFFFF) << 32 | index):
                A.fetch_sub_u32(buf, OFF_ALLOCATED, 1)
                return
        raise RingFullError("free list under constant contention", spins=MAX_SPINS)

    # ---- ring ------------------------------------------------------------------------

    def push(self, index: int, priority: int = PRIORITY) -> bool:
        """Publish slot ``index``; False when the ring is full (original: tail - head >= cap)."""
        buf, cap, mask = self.buf, self.capacity, self.mask
        entry = (priority & 0xFFFFFFFF) << 32 | index
        if entry == 0:
            raise ValueError("priority 0 with slot 0 would be the empty entry")
        for _ in range(MAX_SPINS):
            t = A.load_u64(buf, OFF_TAIL)
            h = A.load_u64(buf, OFF_HEAD)
            if t - h >= cap:
                return False
            off = ENTRY_OFF + (t & mask) * 8
            if A.load_u64(buf, off):
                A.cas_u64(buf, OFF_TAIL, t, t + 1)  # help a producer that stalled or died
                continue
            if A.cas_u64(buf, off, 0, entry):
                if not A.cas_u64(buf, OFF_TAIL, t, t + 1):
                    A.store_u32(buf, OFF_SCAN, 1)  # maybe landed a lap ahead: look for it
                if A.load_u32(buf, OFF_ASLEEP):
                    A.futex_wake(buf, OFF_TAIL, 1)
                return True
        raise RingFullError("ring under constant contention", spins=MAX_SPINS)

    def pop(self, backstop: bool = False) -> int | None:
        """Take the next entry (the one consumer only); None when empty. ``backstop``
        scans for an entry written ahead even without the scan flag (periodic check
        for a producer killed before it could raise the flag)."""
        buf, cap, mask = self.buf, self.capacity, self.mask
        for _ in range(MAX_SPINS):
            h = A.load_u64(buf, OFF_HEAD)
            t = A.load_u64(buf, OFF_TAIL)
            if t - h > cap or h > t:
                raise ProtocolError("head and tail out of range", head=h, tail=t)
            if h == t:
                if A.load_u64(buf, ENTRY_OFF + (t & mask) * 8):
                    A.cas_u64(buf, OFF_TAIL, t, t + 1)
                    continue
                if not A.load_u32(buf, OFF_SCAN) and not backstop:
                    return None
                A.store_u32(buf, OFF_SCAN, 0)
                if not any(
                    A.load_u64(buf, ENTRY_OFF + ((t + k) & mask) * 8) for k in range(1, cap)
                ):
                    return None
                A.store_u32(buf, OFF_SCAN, 1)
                A.cas_u64(buf, OFF_TAIL, t, t + 1)
                continue
            off = ENTRY_OFF + (h & mask) * 8
            entry = A.load_u64(buf, off)
            if entry:
                A.store_u64(buf, off, 0)
            A.store_u64(buf, OFF_HEAD, h + 1)
            if entry:
                return entry
        raise ProtocolError("tail keeps moving without entries", spins=MAX_SPINS)

    def depth(self) -> int:
        return A.load_u64(self.buf, OFF_TAIL) - A.load_u64(self.buf, OFF_HEAD)
