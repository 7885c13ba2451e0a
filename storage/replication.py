"""What the engine ships to a replica group's followers, and how it is framed.

A leader's engine hands every log record it appends (and every queue-level change:
creation, configuration, pause, deletion) to a ``ReplicationSink``, under the queue's
lock, in log order; the sink numbers it with the next log sequence number (lsn) and
keeps it until the followers have it. A follower receives the same bytes as
``Frame`` objects and appends them to its own logs (``Engine.apply``). The frame
bytes are specified in ``docs/format.md`` ("Replication frames") and decoded from
that page's example by ``tests/storage/test_format_doc.py``.

The storage layer knows nothing of HTTP or etcd: the server's replication package
implements the sink and moves frames between machines (``docs/replication.md``).
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Protocol

from dq.storage.errors import CorruptionError, NotLeader, ReplicationTimeout

__all__ = [
    "FRAME_HEADER",
    "KIND_CONTROL",
    "KIND_RECORD",
    "KIND_RECORD_WITH_META",
    "Frame",
    "NotLeader",
    "ReplicationSink",
    "ReplicationTimeout",
    "control_frame_payload",
    "decode_control",
    "decode_frames",
    "encode_frame",
]

#: a log record of type 1: its payload exactly as in the log (entries)
KIND_RECORD = 1
#: a log record of type 2: meta_length u32 | metadata | entries, exactly as in the log
KIND_RECORD_WITH_META = 2
#: a queue-level change, as UTF-8 JSON: ``{"op": "put_queue", "config": {...}}``,
#: ``{"op": "delete_queue"}`` or ``{"op": "paused", "paused": true}``
KIND_CONTROL = 16
_KINDS = (KIND_RECORD, KIND_RECORD_WITH_META, KIND_CONTROL)

#: length of what follows the crc, crc32 of what follows it, lsn, kind, queue name length
FRAME_HEADER = struct.Struct(">IIQBB")
assert FRAME_HEADER.size == 18
_AFTER_CRC = struct.Struct(">QBB")


@dataclass(frozen=True, slots=True)
class Frame:
    """One shipped record: its lsn, the queue it belongs to, its kind and payload."""

    lsn: int
    queue: str
    kind: int
    payload: bytes


def encode_frame(frame: Frame) -> bytes:
    """The frame's bytes: ``length u32 | crc32 u32 | lsn u64 | kind u8 | queue_len u8 |
    queue | payload`` (big-endian; length and crc cover everything after the crc)."""
    name = frame.queue.encode("ascii")
    body = _AFTER_CRC.pack(frame.lsn, frame.kind, len(name)) + name + frame.payload
    return struct.pack(">II", len(body), zlib.crc32(body)) + body


def decode_frames(buf: bytes | bytearray | memoryview) -> list[Frame]:
    """Every frame in ``buf``, in order. A short, damaged or unknown frame raises
    ``CorruptionError`` naming its offset: nothing of a damaged transfer is applied."""
    view = memoryview(buf)
    frames: list[Frame] = []
    offset = 0
    end = len(view)
    while offset < end:
        if end - offset < FRAME_HEADER.size:
            raise CorruptionError("replication frame cut short", file="<stream>", offset=offset)
        length, crc, lsn, kind, qlen = FRAME_HEADER.unpack_from(view, offset)
        start = offset + 8
        stop = start + length
        if length < _AFTER_CRC.size + qlen or stop > end:
            raise CorruptionError(
                "replication frame length runs past the data", file="<stream>", offset=offset
            )
        body = view[start:stop]
        if zlib.crc32(body) != crc:
            raise CorruptionError(
                "replication frame fails its checksum", file="<stream>", offset=offset
            )
        if kind not in _KINDS:
            raise CorruptionError(
                f"unknown replication frame kind {kind}", file="<stream>", offset=offset
            )
        name_at = _AFTER_CRC.size
        try:
            queue = bytes(body[name_at : name_at + qlen]).decode("ascii")
        except UnicodeDecodeError:
            raise CorruptionError(
                "replication frame queue name is not ASCII", file="<stream>", offset=offset
            ) from None
        frames.append(Frame(lsn, queue, kind, bytes(body[name_at + qlen :])))
        offset = stop
    return frames


def control_frame_payload(op: str, **fields: Any) -> bytes:
    return json.dumps({"op": op, **fields}, separators=(",", ":"), sort_keys=True).encode()


def decode_control(frame: Frame) -> dict[str, Any]:
    try:
        op = json.loads(frame.payload)
    except ValueError as exc:
        raise CorruptionError(
            f"replication control frame is not JSON: {exc}", file="<stream>", offset=frame.lsn
        ) from None
    if not isinstance(op, dict) or not isinstance(op.get("op"), str):
        raise CorruptionError(
            "replication control frame has no op", file="<stream>", offset=frame.lsn
        )
    return op


class ReplicationSink(Protocol):
    """What a leader's engine needs from its replicator (the server implements it)."""

    #: how long a write waits for the sync set before it is answered
    #: ``ReplicationTimeout`` (its outcome unknown; it still publishes if it commits)
    commit_timeout_s: float

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        """Number and keep one record; called under the queue's lock, in log order, so
        it must not block. Returns its lsn (> 0)."""
        ...

    def admits_writes(self) -> bool:
        """False while the sync set has acknowledged nothing for a commit timeout
        although writes wait: new writes are then refused before they are written."""
        ...

    def local_failure(self, queue: str, error: BaseException) -> None:
        """A queue failed on the leader (a write or fsync error): the leader's log
        may now hold what the followers do not, so the node must step down."""
        ...


_ = (NotLeader, ReplicationTimeout)  # re-exported: the errors the replica layer raises
