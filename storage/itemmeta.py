"""Item metadata: idempotency keys, the queue a dead letter came from, the ticks
schedules fired, and items' groups.

Both travel in the same log record as their items (a type-2 record: metadata, then the
entries; ``docs/format.md``), so a key is exactly as durable as its item: a crash keeps
both or neither. Metadata is not part of the entry format, so segment files do not
carry it; when a log is frozen, the worker first writes its metadata to a *sidecar*
``NNNNNNNNNN.meta`` (same number as the log) and only then the segment file, so the
metadata of every log that no longer exists is in a sidecar. Opening a queue reads the
sidecars and the metadata of logs not yet frozen.

Keys are remembered for the queue's ``dedup_window_ms`` after the enqueue that wrote
them; sidecars holding only expired keys are deleted. Origins (``dead_lettered_from``)
are kept as long as the queue: dead-letter queues are small, and an origin costs one
dict entry.

A schedule's tick (``storage/schedules.py``) is written as an item whose record also
says "schedule S fired tick T, its n-th": the schedule's progress is exactly as durable
as the item, so a crash keeps both or neither and a tick is never fired twice. The
latest durable tick of each schedule is kept (``fired``); a sidecar is kept while it
holds one (a later durable tick in a later log supersedes it).

    meta entry, key:      01 | id u64 | deadline u64 | time u64 | key_length u8 | key (UTF-8)
    meta entry, origin:   02 | id u64 | name_length u8 | queue name (ASCII)
    meta entry, schedule: 03 | schedule id u64 | tick u64 | count u64 | name_length u8 | name
    meta entry, group:    04 | id u64 | group_length u8 | group (printable ASCII)

A group (``docs/delivery.md``) is written in every record that writes a pending entry of
a grouped item (enqueue, requeue, lease expiry, a dead letter's enqueue), so the entry
and its group are durable together. It is not kept here: the in-memory segment holds the
groups of its entries, and freezing moves them into the segment file's group column
(``storage/segment.py``), not into the sidecar — a group lives exactly as long as its
entry, and costs no memory while its item waits in a segment file.
"""

from __future__ import annotations

import os
import re
import struct
import sys
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dq.storage import fileio
from dq.storage.errors import CorruptionError, InvalidGroup, InvalidKey, ReplicationTimeout

__all__ = [
    "MAX_KEY_BYTES",
    "SIDECAR_HEADER",
    "Fired",
    "ItemMeta",
    "Remembered",
    "check_group",
    "check_key",
    "decode_meta",
    "encode_group_entry",
    "encode_key_entry",
    "encode_origin_entry",
    "encode_schedule_entry",
    "groups_of",
    "read_sidecar",
    "sidecar_name",
    "without_groups",
    "write_sidecar",
]

MAX_KEY_BYTES = 128
TAG_KEY = 1
TAG_ORIGIN = 2
TAG_SCHEDULE = 3
TAG_GROUP = 4
MAX_GROUP_BYTES = 128
KEY_ENTRY = struct.Struct(">BQQQB")  # tag, id, deadline, time, key length
assert KEY_ENTRY.size == 26
ORIGIN_ENTRY = struct.Struct(">BQB")  # tag, id, name length
assert ORIGIN_ENTRY.size == 10
SCHEDULE_ENTRY = struct.Struct(">BQQQB")  # tag, schedule id, tick, count, name length
assert SCHEDULE_ENTRY.size == 26
GROUP_ENTRY = struct.Struct(">BQB")  # tag, id, group length
assert GROUP_ENTRY.size == 10
SIDECAR_MAGIC = b"DQMT"
SIDECAR_VERSION = 1
#: magic, version, reserved, log number, metadata length, crc32 of the metadata
SIDECAR_HEADER = struct.Struct(">4sHHQII")
assert SIDECAR_HEADER.size == 24
_SIDECAR = re.compile(r"(\d{10})\.meta")


def check_key(key: object, index: int | None = None) -> bytes:
    """The key's UTF-8 bytes, or ``InvalidKey`` saying what to fix."""
    where = {} if index is None else {"index": index}
    if not isinstance(key, str):
        raise InvalidKey("key must be a string", **where)
    try:
        raw = key.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidKey("key must be valid UTF-8 text", **where) from None
    if not 1 <= len(raw) <= MAX_KEY_BYTES:
        raise InvalidKey(f"key is {len(raw)} bytes of UTF-8; give 1 to {MAX_KEY_BYTES}", **where)
    return raw


def check_group(group: object, index: int | None = None) -> str:
    """The group, interned, or ``InvalidGroup`` saying what to fix: 1 to 128 printable
    ASCII characters (space to ``~``), so that it reads the same in a log, a URL, a
    metric label and an SQS ``MessageGroupId``."""
    where = {} if index is None else {"index": index}
    if not isinstance(group, str):
        raise InvalidGroup("group must be a string", **where)
    if not 1 <= len(group) <= MAX_GROUP_BYTES:
        raise InvalidGroup(
            f"group is {len(group)} characters; give 1 to {MAX_GROUP_BYTES}", **where
        )
    if not (group.isascii() and group.isprintable()):
        raise InvalidGroup("group must be printable ASCII (space to ~)", **where)
    return intern_group(group)


def encode_group_entry(item_id: int, group: str) -> bytes:
    raw = group.encode("ascii")
    return GROUP_ENTRY.pack(TAG_GROUP, item_id, len(raw)) + raw


def groups_of(buf: bytes, where: str = "<metadata>") -> dict[int, str]:
    """id -> group of the group entries in one record's (or log's) metadata."""
    out: dict[int, str] = {}
    if buf.find(b"\x04") < 0:  # no group entry can be in it (the common case)
        return out
    for kind, item_id, _d, _t, text in decode_meta(buf, where):
        if kind == "group":
            out[item_id] = intern_group(text)
    return out


def without_groups(buf: bytes, where: str = "<metadata>") -> bytes:
    """The metadata less its group entries (what a sidecar keeps: the segment file has
    the groups)."""
    if buf.find(b"\x04") < 0:
        return buf
    out: list[bytes] = []
    for kind, item_id, deadline, time, text in decode_meta(buf, where):
        if kind == "key":
            out.append(encode_key_entry(item_id, deadline, time, text.encode("utf-8")))
        elif kind == "origin":
            out.append(encode_origin_entry(item_id, text))
        elif kind == "schedule":
            out.append(encode_schedule_entry(item_id, deadline, time, text))
    return b"".join(out)


def encode_key_entry(item_id: int, deadline: int, time: int, key: bytes) -> bytes:
    return KEY_ENTRY.pack(TAG_KEY, item_id, deadline, time, len(key)) + key


def encode_origin_entry(item_id: int, queue: str) -> bytes:
    name = queue.encode("ascii")
    return ORIGIN_ENTRY.pack(TAG_ORIGIN, item_id, len(name)) + name


def encode_schedule_entry(schedule_id: int, tick: int, count: int, name: str) -> bytes:
    raw = name.encode("ascii")
    return SCHEDULE_ENTRY.pack(TAG_SCHEDULE, schedule_id, tick, count, len(raw)) + raw


#: ("key", id, deadline, time, key) / ("origin", id, 0, 0, queue) /
#: ("schedule", schedule id, tick, count, schedule name) / ("group", id, 0, 0, group)
Decoded = tuple[str, int, int, int, str]


def decode_meta(buf: bytes, where: str = "<metadata>") -> Iterator[Decoded]:
    pos, end = 0, len(buf)
    while pos < end:
        tag = buf[pos]
        if tag == TAG_KEY and end - pos >= KEY_ENTRY.size:
            _t, item_id, deadline, time, n = KEY_ENTRY.unpack_from(buf, pos)
            start = pos + KEY_ENTRY.size
            if start + n > end:
                break
            yield "key", item_id, deadline, time, buf[start : start + n].decode("utf-8", "replace")
            pos = start + n
        elif tag == TAG_ORIGIN and end - pos >= ORIGIN_ENTRY.size:
            _t, item_id, n = ORIGIN_ENTRY.unpack_from(buf, pos)
            start = pos + ORIGIN_ENTRY.size
            if start + n > end:
                break
            yield "origin", item_id, 0, 0, buf[start : start + n].decode("ascii", "replace")
            pos = start + n
        elif tag == TAG_SCHEDULE and end - pos >= SCHEDULE_ENTRY.size:
            _t, sid, tick, count, n = SCHEDULE_ENTRY.unpack_from(buf, pos)
            start = pos + SCHEDULE_ENTRY.size
            if start + n > end:
                break
            yield "schedule", sid, tick, count, buf[start : start + n].decode("ascii", "replace")
            pos = start + n
        elif tag == TAG_GROUP and end - pos >= GROUP_ENTRY.size:
            _t, item_id, n = GROUP_ENTRY.unpack_from(buf, pos)
            start = pos + GROUP_ENTRY.size
            if start + n > end or n == 0:
                break
            yield "group", item_id, 0, 0, buf[start : start + n].decode("ascii", "replace")
            pos = start + n
        else:
            break
    if pos != end:
        raise CorruptionError("malformed item metadata", file=where, offset=pos)


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


@dataclass(slots=True)
class Remembered:
    """The first enqueue of a key: its answer, when it was written, and (until it is
    durable) the future of its batch, which a repeat must wait for."""

    id: int
    deadline: int
    time: int
    pending: Future[Any] | None = None


@dataclass(slots=True)
class Fired:
    """A schedule's progress in its queue: the last tick written and how many ticks it
    has fired, and the same as far as a durable record says (``durable_*``; 0: none).
    The two differ while a tick's record is on its way to disk."""

    tick: int
    count: int
    durable_tick: int = 0
    durable_count: int = 0


class ItemMeta:
    """One queue's idempotency keys (within the window), dead-letter origins and the
    progress of its schedules."""

    def __init__(self) -> None:
        self.keys: dict[str, Remembered] = {}
        self._order: deque[tuple[int, str]] = deque()  # (time, key), oldest first
        self.origins: dict[int, str] = {}
        #: schedule id -> its progress (``storage/schedules.py``)
        self.fired: dict[int, Fired] = {}
        #: when sidecars were last checked for expired keys (ms)
        self.sidecars_checked = 0

    # -------------------------------------------------------------- keys

    def lookup(self, key: str, now: int, window: int) -> Remembered | None:
        self.prune(now, window)
        return self.keys.get(key)

    def remember(self, key: str, entry: Remembered) -> None:
        self.keys[key] = entry
        self._order.append((entry.time, key))

    def settled(self, keys: list[str], entries: list[Remembered], fut: Future[Any]) -> None:
        """The batch that wrote ``keys`` is durable (keep them) or failed (forget them).

        A replicated write answered ``ReplicationTimeout`` is neither: its record is in
        the log and may still commit. Its keys stay, still pending on that answered
        future, so a repeat is answered "unknown" too rather than writing a second
        item; the batch's publication clears ``pending`` once it does commit."""
        error = None if fut.cancelled() else fut.exception()
        in_doubt = isinstance(error, ReplicationTimeout)
        failed = fut.cancelled() or (error is not None and not in_doubt)
        for key, entry in zip(keys, entries, strict=True):
            if in_doubt:
                continue
            entry.pending = None
            if failed and self.keys.get(key) is entry:
                del self.keys[key]

    def prune(self, now: int, window: int) -> None:
        order, keys = self._order, self.keys
        limit = now - window
        while order and order[0][0] <= limit:
            time, key = order.popleft()
            entry = keys.get(key)
            if entry is not None and entry.time == time and entry.pending is None:
                del keys[key]

    # -------------------------------------------------------------- schedules

    def note_fired(self, schedule_id: int, tick: int, count: int) -> None:
        """A record saying the schedule fired ``tick`` is on its way (under the lock)."""
        f = self.fired.get(schedule_id)
        if f is None:
            self.fired[schedule_id] = Fired(tick, count)
        else:
            f.tick, f.count = tick, count

    def fired_settled(self, schedule_id: int, tick: int, count: int, fut: Future[Any]) -> None:
        """That record is durable (its tick becomes the durable progress) or refused
        (the progress goes back to the durable one). A replicated write answered
        ``ReplicationTimeout`` is in the log and may still commit: it stays."""
        f = self.fired.get(schedule_id)
        if f is None:
            return
        error = None if fut.cancelled() else fut.exception()
        if error is None and not fut.cancelled():
            if tick > f.durable_tick:
                f.durable_tick, f.durable_count = tick, count
        elif not isinstance(error, ReplicationTimeout) and f.tick == tick:
            f.tick, f.count = f.durable_tick, f.durable_count
            if f.tick == 0:
                del self.fired[schedule_id]

    def forget_schedule(self, schedule_id: int) -> None:
        """The schedule was deleted: its progress no longer keeps a sidecar."""
        self.fired.pop(schedule_id, None)

    def _load_fired(self, schedule_id: int, tick: int, count: int) -> None:
        f = self.fired.get(schedule_id)
        if f is None:
            self.fired[schedule_id] = Fired(tick, count, tick, count)
        elif tick > f.durable_tick:
            if tick >= f.tick:
                f.tick, f.count = tick, count
            f.durable_tick, f.durable_count = tick, count

    # -------------------------------------------------------------- loading

    def load(self, buf: bytes, where: str, now: int, window: int) -> bool:
        """Take what a durable record or sidecar says; True if it holds an origin or a
        schedule's progress (something kept beyond the dedup window)."""
        has_origin = False
        for kind, item_id, deadline, time, text in decode_meta(buf, where):
            if kind == "origin":
                self.origins[item_id] = _intern(text)
                has_origin = True
            elif kind == "schedule":
                self._load_fired(item_id, deadline, time)
                has_origin = True
            elif kind == "group":
                continue  # the memseg and the segment files hold groups
            elif window > 0 and time > now - window:
                known = self.keys.get(text)
                if known is None or known.time < time:
                    self.remember(text, Remembered(item_id, deadline, time))
        return has_origin

    def load_directory(self, directory: str, logs: list[str], now: int, window: int) -> None:
        """Sidecars first (older logs), then the logs that were not frozen yet; delete
        sidecars that hold nothing worth keeping any more."""
        from dq.storage.wal import read_wal

        for name in sorted(os.listdir(directory)):
            if _SIDECAR.fullmatch(name) is None:
                continue
            path = os.path.join(directory, name)
            _no, meta = read_sidecar(path)
            before = len(self.keys)
            if not self.load(meta, path, now, window) and len(self.keys) == before:
                fileio.remove(path)
        for path in logs:
            for _off, meta in read_wal(path).meta:
                self.load(meta, path, now, window)
        self._order = deque(sorted(self._order))

    def prune_sidecars(self, directory: str, now: int, window: int) -> int:
        """Delete sidecars whose keys are all expired and that name no origin and no
        schedule's latest durable tick. (A tick older than its schedule's durable one is
        superseded by a later record, whose log, or sidecar once frozen, stays.)"""
        removed = 0
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            return 0
        for name in names:
            if _SIDECAR.fullmatch(name) is None:
                continue
            path = os.path.join(directory, name)
            try:
                _no, meta = read_sidecar(path)
            except (OSError, CorruptionError):
                continue
            keep = False
            for kind, item_id, deadline, time, _t in decode_meta(meta, path):
                if kind == "schedule":
                    f = self.fired.get(item_id)
                    if f is not None and deadline >= f.durable_tick:
                        keep = True
                        break
                elif kind == "group":
                    continue
                elif kind == "origin" or (window > 0 and time > now - window):
                    keep = True
                    break
            if not keep:
                fileio.remove(path)
                removed += 1
        return removed


_interned: dict[str, str] = {}


def _intern(name: str) -> str:
    return _interned.setdefault(name, name)


def intern_group(group: str) -> str:
    """One string object per group text, so a group's many entries (in in-memory
    segments, leases, the delivery index) share it. ``sys.intern``: its table lets go of
    a group no entry holds any more."""
    return sys.intern(group)
