"""Metadata sidecars: ``NNNNNNNNNN.meta``, the item metadata of log ``NNNNNNNNNN``
once the log is frozen (``docs/format.md``, "Item metadata").

The worker writes a log's metadata here, fsynced and renamed into place, *before* the
log's segment file, so whenever a log is gone its metadata is in a sidecar. A sidecar is
checked whole (magic, version, length, crc32) when a queue opens; an item's reasons are
read from one later by offset (``storage/reasons.py``), which the header's fixed size
makes a single ``pread``.
"""

from __future__ import annotations

import os
import struct
import zlib

from dq.storage import fileio
from dq.storage.errors import CorruptionError

__all__ = [
    "SIDECAR_HEADER",
    "SIDECAR_MAGIC",
    "SIDECAR_VERSION",
    "read_sidecar",
    "sidecar_name",
    "write_sidecar",
]

SIDECAR_MAGIC = b"DQMT"
SIDECAR_VERSION = 1
#: magic, version, reserved, log number, metadata length, crc32 of the metadata
SIDECAR_HEADER = struct.Struct(">4sHHQII")
assert SIDECAR_HEADER.size == 24


def sidecar_name(segment_no: int) -> str:
    return f"{segment_no:010d}.meta"


def write_sidecar(directory: str, segment_no: int, meta: bytes) -> str:
    """Write the metadata of log ``segment_no`` durably (before its segment file exists)."""
    body = SIDECAR_HEADER.pack(
        SIDECAR_MAGIC, SIDECAR_VERSION, 0, segment_no, len(meta), zlib.crc32(meta)
    )
    path = os.path.join(directory, sidecar_name(segment_no))
    fileio.write_file_atomic(path, body + meta)
    return path


def read_sidecar(path: str) -> tuple[int, bytes]:
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < SIDECAR_HEADER.size:
        raise CorruptionError("metadata sidecar shorter than its header", file=path, offset=0)
    magic, version, _r, segment_no, length, crc = SIDECAR_HEADER.unpack_from(data, 0)
    meta = data[SIDECAR_HEADER.size :]
    if magic != SIDECAR_MAGIC or version != SIDECAR_VERSION:
        raise CorruptionError("not a dq metadata sidecar", file=path, offset=0)
    if len(meta) != length or zlib.crc32(meta) != crc:
        raise CorruptionError("metadata sidecar checksum mismatch", file=path, offset=0)
    return segment_no, meta
