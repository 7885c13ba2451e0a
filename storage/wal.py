"""Write-ahead log: one per in-memory segment (``0000000001.log``).

Specification: ``docs/format.md`` ("Write-ahead log"). A 32-byte header names the
segment number and the id floor (the next id to assign when the log was created, so
ids are never reused even after every segment is merged away). Then records:

    length u32 | crc32 u32 (over type and payload) | type u8 | payload

A type-1 payload is a batch of entries in the original design's format (``dq.storage.codec``).
One record is one atomic batch: it is either wholly recovered or wholly dropped.
Framing and its CRC-32 are compiled (``storage/_wal.c``), as is a durable round's write
and fdatasync, which ``fileio.pwrite_and_sync`` runs with the GIL released once.

Recovery rule (``read_wal``): decided by declared lengths, never by the contents of
a payload. A record whose length runs past the end of the file, or a complete record
failing its checksum with nothing but zeros after it, is a torn tail — a normal crash;
it is copied aside and truncated. A complete bad record followed by more data is
corruption in the middle and an error naming file and offset. An all-zero record
header followed by zeros marks the end of preallocated space.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
from dataclasses import dataclass, field

from dq.storage import _wal, fileio
from dq.storage.errors import CorruptionError, EngineUnavailable
from dq.storage.prealloc import AllocationStep

__all__ = [
    "HEADER",
    "RECORD_ENTRIES",
    "RECORD_HEADER",
    "RECORD_WITH_META",
    "WalContents",
    "WalWriter",
    "encode_header",
    "frame_record",
    "read_wal",
    "record_body",
    "recover_wal",
    "split_meta",
]

log = logging.getLogger(__name__)

MAGIC = b"DQWL"
VERSION = 1
#: magic, version, reserved, segment number, id floor, reserved, crc32 of the first 28 bytes
HEADER = struct.Struct(">4sHHQQII")
assert HEADER.size == 32
#: payload length, crc32 of (type byte + payload), type
RECORD_HEADER = struct.Struct(">IIB")
assert RECORD_HEADER.size == 9
RECORD_ENTRIES = 1
#: a batch of entries preceded by item metadata (``storage/itemmeta.py``):
#: payload = meta_length u32 | meta | entries
RECORD_WITH_META = 2
_RECORD_KINDS = (RECORD_ENTRIES, RECORD_WITH_META)
_META_LENGTH = struct.Struct(">I")


def encode_header(segment_no: int, id_floor: int) -> bytes:
    body = HEADER.pack(MAGIC, VERSION, 0, segment_no, id_floor, 0, 0)[:28]
    return body + struct.pack(">I", _wal.crc32(body))


def record_body(payload: bytes, meta: bytes = b"") -> tuple[int, bytes]:
    """A record's type and payload as the log holds them (``meta`` makes it type 2)."""
    if meta:
        return RECORD_WITH_META, _META_LENGTH.pack(len(meta)) + meta + payload
    return RECORD_ENTRIES, payload


def split_meta(body: bytes) -> tuple[bytes, bytes]:
    """A type-2 payload's (metadata, entries)."""
    if len(body) < _META_LENGTH.size:
        raise CorruptionError("record with metadata cut short", file="<record>", offset=0)
    (n,) = _META_LENGTH.unpack_from(body)
    if _META_LENGTH.size + n > len(body):
        raise CorruptionError("record metadata runs past its payload", file="<record>", offset=0)
    return body[_META_LENGTH.size : _META_LENGTH.size + n], body[_META_LENGTH.size + n :]


def frame_header(payload: bytes, kind: int = RECORD_ENTRIES) -> bytes:
    """The 9-byte header that frames ``payload`` as a record of type ``kind``."""
    return _wal.header(payload, kind)


def frame_record(payload: bytes, kind: int = RECORD_ENTRIES) -> bytes:
    return frame_header(payload, kind) + payload


@dataclass
class WalContents:
    """What a log holds: its header fields, its valid records, and where validity ends."""

    path: str
    segment_no: int
    id_floor: int
    #: (offset, entries) per record; for a record with metadata the offset is moved past
    #: the metadata, so ``offset + RECORD_HEADER.size`` is where its entries begin
    records: list[tuple[int, bytes]] = field(default_factory=list)
    #: (record offset, metadata bytes) of each record that carries item metadata
    meta: list[tuple[int, bytes]] = field(default_factory=list)
    valid_end: int = HEADER.size
    file_size: int = 0
    #: everything after ``valid_end`` is zeros (preallocated space, not damage)
    zero_tail: bool = False

    @property
    def torn_bytes(self) -> int:
        return 0 if self.zero_tail else self.file_size - self.valid_end


def _parse_header(path: str, data: bytes) -> tuple[int, int]:
    if len(data) < HEADER.size:
        raise CorruptionError("log shorter than its header", file=path, offset=0)
    magic, version, _r1, segment_no, id_floor, _r2, crc = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptionError("not a dq log (bad magic)", file=path, offset=0)
    if _wal.crc32(data[:28]) != crc:
        raise CorruptionError("log header checksum mismatch", file=path, offset=0)
    if version != VERSION:
        raise CorruptionError(f"unsupported log version {version}", file=path, offset=4)
    return segment_no, id_floor


def _zero(data: bytes, start: int, stop: int | None = None) -> bool:
    return not data[start:stop].strip(b"\0")


def read_wal(path: str) -> WalContents:
    """Parse a whole log by declared lengths. Raises ``CorruptionError`` for a bad header
    or for a complete record that fails its checksum and is followed by more data.

    The rule (``docs/format.md``, "Recovery"), decided by lengths alone, never by
    looking inside a payload for something that resembles a record (a value may hold
    any bytes, a whole log record included):

    - a record header cut short, or a record whose declared length runs past the end
      of the file, is a *torn tail*, whatever its bytes contain;
    - a complete record that fails its checksum is a torn tail when nothing but zeros
      follows it (the last write of a crash), and corruption otherwise;
    - an all-zero record header followed only by zeros is the end of preallocated space.
    """
    with open(path, "rb") as f:
        data = f.read()
    segment_no, id_floor = _parse_header(path, data)
    size = len(data)
    contents = WalContents(path, segment_no, id_floor, file_size=size)
    pos = HEADER.size
    while pos < size:
        if size - pos < RECORD_HEADER.size or _zero(data, pos, pos + RECORD_HEADER.size):
            contents.zero_tail = _zero(data, pos)
            if not contents.zero_tail and size - pos >= RECORD_HEADER.size:
                raise CorruptionError(
                    "zeroed record header in the middle of the log", file=path, offset=pos
                )
            break
        length, crc, kind = RECORD_HEADER.unpack_from(data, pos)
        start = pos + RECORD_HEADER.size
        end = start + length
        if end > size:
            break  # torn tail: the write of this record never finished
        payload = data[start:end]
        if kind not in _RECORD_KINDS or _wal.crc32(payload, _wal.crc32(bytes((kind,)))) != crc:
            if _zero(data, end):
                break  # the last record, torn: its bytes did not all reach the disk
            raise CorruptionError(
                "bad record in the middle of the log", file=path, offset=pos, length=length
            )
        if kind == RECORD_WITH_META:
            (meta_len,) = _META_LENGTH.unpack_from(payload, 0) if len(payload) >= 4 else (-1,)
            if not 0 <= meta_len <= len(payload) - 4:
                raise CorruptionError("record metadata runs past its record", file=path, offset=pos)
            contents.meta.append((pos, payload[4 : 4 + meta_len]))
            contents.records.append((pos + 4 + meta_len, payload[4 + meta_len :]))
        else:
            contents.records.append((pos, payload))
        pos = end
    contents.valid_end = pos
    return contents


def _cut(path: str, size: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        fileio.truncate(fd, size, path)
        fileio.fsync(fd, path)
    finally:
        os.close(fd)


def recover_wal(path: str) -> WalContents:
    """Read a log and cut off a torn tail, copying the bad bytes aside first."""
    contents = read_wal(path)
    if contents.zero_tail and contents.file_size > contents.valid_end:
        _cut(path, contents.valid_end)  # unused preallocated space: nothing to keep
    elif contents.torn_bytes > 0:
        with open(path, "rb") as f:
            f.seek(contents.valid_end)
            bad = f.read()
        aside = f"{path}.torn-{contents.valid_end}"
        fileio.write_file_atomic(aside, bad)
        _cut(path, contents.valid_end)
        log.warning(
            "log %s: dropped a torn tail of %d bytes at offset %d (saved to %s)",
            path,
            len(bad),
            contents.valid_end,
            aside,
        )
    return contents


class WalWriter:
    """Appends framed records to one log file.

    ``append`` only frames into an in-memory buffer (cheap, safe on an event loop);
    ``write`` puts the buffer at the end of the valid bytes with one ``pwrite``; ``sync``
    makes it durable. The caller numbers records with the returned sequence so a syncer
    can tell which appends one fsync covered (group commit). ``io_lock`` serialises
    write/sync/close.

    Preallocation: the file is grown ahead of the data in steps that ``prealloc``
    sizes (``storage/prealloc.py``: 64 KiB, doubling up to 1 MiB while the log is hot),
    allocated and not written (``fileio.allocate``: they read as zeros), so most syncs
    write into blocks the file already has and ``fdatasync`` has no file size to record:
    on ext4 an appending sync also waits for a journal commit on the journal's thread,
    one more sleep per durable round (``bench/NOTES.md``, "A durable ring operation,
    counted"). Recovery reads an all-zero record header as the end of the log, and
    closing the log gives the unused steps back. A write that fails does not move
    ``offset``: the next write overwrites whatever part of it reached the file.
    """

    def __init__(
        self,
        path: str,
        segment_no: int,
        id_floor: int,
        fd: int,
        offset: int,
        prealloc: AllocationStep | None = None,
    ) -> None:
        self.path = path
        self.segment_no = segment_no
        self.id_floor = id_floor
        self._fd = fd
        self.offset = offset  # end of the valid bytes in the file
        self.allocated = offset  # bytes the file holds (zeros past ``offset``)
        self.prealloc = prealloc
        self.size = offset  # bytes in the file plus the buffer
        self.synced_offset = offset  # end of the bytes the last successful sync covered
        self._buffer = bytearray()
        self.appended_seq = 0
        self.io_lock = threading.Lock()
        self.closed = False

    @classmethod
    def create(
        cls,
        directory: str,
        segment_no: int,
        id_floor: int,
        prealloc: AllocationStep | None = None,
    ) -> WalWriter:
        """Create a new, empty log: all or nothing (on failure no file is left behind)."""
        path = os.path.join(directory, f"{segment_no:010d}.log")
        tmp = path + ".tmp"
        try:
            fileio.write_file_atomic(path, encode_header(segment_no, id_floor))
            fd = fileio.open_for_write(path)
        except BaseException:
            for leftover in (tmp, path):
                try:
                    os.unlink(leftover)
                except OSError:
                    pass
            raise
        return cls(path, segment_no, id_floor, fd, HEADER.size, prealloc)

    def append(self, payload: bytes, meta: bytes = b"") -> int:
        """Frame one record (with item metadata if ``meta``); returns its sequence number."""
        if meta:
            kind, body = record_body(payload, meta)
        else:
            kind, body = RECORD_ENTRIES, payload
        self.size += _wal.frame_into(self._buffer, body, kind)
        self.appended_seq += 1
        return self.appended_seq

    def take_buffer(self) -> tuple[bytes, int]:
        """Detach what has been appended so far (call under the owner's lock)."""
        data = bytes(self._buffer)
        self._buffer.clear()
        return data, self.appended_seq

    def discard_buffer(self) -> None:
        """Forget appended records that were never written: their batches were refused."""
        self.size -= len(self._buffer)
        self._buffer.clear()

    def write(self, data: bytes) -> None:
        """Write detached bytes after the valid ones (call under ``io_lock``)."""
        if self.closed:  # never write through a descriptor number that may be reused
            raise EngineUnavailable("log is closed", file=self.path)
        if data:
            end = self._grow(len(data))
            fileio.pwrite_all(self._fd, data, self.offset, self.path)
            self.offset = end
            self.allocated = max(self.allocated, end)

    def _grow(self, n: int) -> int:
        """Preallocate past the ``n`` bytes about to be written; where they will end."""
        end = self.offset + n
        if self.prealloc is not None and end > self.allocated:
            grown = self.prealloc.end_for(end)
            if fileio.allocate(self._fd, self.allocated, grown - self.allocated, self.path):
                self.allocated = grown
            else:  # the file system cannot: this log appends plainly from now on
                self.prealloc = None
        return end

    def write_and_sync(self, data: bytes) -> None:
        """``write`` then ``sync`` (call under ``io_lock``), a durable round's two steps:
        one compiled call without the GIL unless a test watches the steps
        (``fileio.pwrite_and_sync``). If the write went through and the sync failed,
        ``offset`` is past the data and ``synced_offset`` is not, as with the two calls."""
        if self.closed:
            raise EngineUnavailable("log is closed", file=self.path)
        if not data:
            self.sync()
            return
        end = self.offset + len(data)
        if self.prealloc is not None and end > self.allocated:
            self._grow(len(data))
        failed = fileio.pwrite_and_sync(self._fd, data, self.offset, self.path)
        self.offset = end
        self.allocated = max(self.allocated, end)
        if failed is not None:
            raise failed
        self.synced_offset = end

    def sync(self) -> None:
        """fdatasync (call under ``io_lock``): everything written so far becomes durable."""
        if self.closed:
            raise EngineUnavailable("log is closed", file=self.path)
        offset = self.offset
        fileio.fdatasync(self._fd, self.path)
        self.synced_offset = offset

    def close(self, *, sync: bool) -> None:
        """Write what is buffered, sync, close. The descriptor is closed even when the
        write or sync fails (the error is raised after)."""
        with self.io_lock:
            if self.closed:
                return
            try:
                data, _seq = self.take_buffer()
                self.write(data)
                if self.allocated > self.offset:  # give the unused preallocation back
                    fileio.truncate(self._fd, self.offset, self.path)
                if sync:
                    self.sync()
            finally:
                self.abandon()

    def abandon(self) -> None:
        """Close the descriptor without writing or syncing anything more."""
        if not self.closed:
            self.closed = True
            self._buffer.clear()
            os.close(self._fd)

    def copy_to(self, dest: str) -> None:
        """Write the log as appended so far — its valid bytes and its buffer — to a new
        file ``dest`` (call under the owner's lock and ``io_lock``): a replica's copy."""
        with open(self.path, "rb") as src, open(dest, "wb") as out:
            remaining = self.offset
            while remaining > 0:
                chunk = src.read(min(remaining, 1 << 20))
                if not chunk:
                    raise CorruptionError("log shorter than written", file=self.path, offset=0)
                out.write(chunk)
                remaining -= len(chunk)
            out.write(self._buffer)

    def cut_back(self, keep: int) -> None:
        """Truncate the file to ``keep`` bytes and sync, closing the log.

        Used after a failed write or sync: the bytes past the last acknowledged record
        belong to refused batches, and the page cache cannot be trusted to say what
        reached the disk, so they are cut off before the log is read again.
        """
        with self.io_lock:
            if self.closed:
                fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)
            else:
                fd, self.closed = self._fd, True
                self._buffer.clear()
            try:
                fileio.truncate(fd, keep, self.path)
                fileio.fsync(fd, self.path)
            finally:
                os.close(fd)
