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

An item's reasons (``storage/reasons.py``: its last errors) are an error entry written
with each pending entry of the item; the newest entry of an id names where the item is.

A key entry names the item the key addresses now: written when the key is first
enqueued, and again (same ``time``, so its window does not move) by every record that
moves that item to a new deadline; an enqueue that replaces the item, or a move by key,
writes it with a new ``time``. A key entry with id 0 says the key names no item any
more (its item was cancelled by key). The newest entry of a key wins.

    meta entry, key:      01 | id u64 | deadline u64 | time u64 | key_length u8 | key (UTF-8)
    meta entry, origin:   02 | id u64 | name_length u8 | queue name (ASCII)
    meta entry, schedule: 03 | schedule id u64 | tick u64 | count u64 | name_length u8 | name
    meta entry, group:    04 | id u64 | group_length u8 | group (printable ASCII)
    meta entry, error:    05 | version u8 | id u64 | deadline u64 | count u8 | reasons

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
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from dq.storage import fileio
from dq.storage.errors import CorruptionError, InvalidGroup, InvalidKey, ReplicationTimeout
from dq.storage.reasons import ERROR_ENTRY, TAG_ERROR, ItemErrors, decode_error_entry
from dq.storage.sidecar import SIDECAR_HEADER, read_sidecar, sidecar_name, write_sidecar

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
    "sidecar_offsets",
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
        elif kind == "error":  # as written (``time`` is where it starts)
            out.append(buf[time : decode_error_entry(buf, time, where)[3]])
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
#: ("schedule", schedule id, tick, count, schedule name) / ("group", id, 0, 0, group) /
#: ("error", id, deadline, offset of the entry in ``buf``, "") — its reasons:
#: ``reasons.decode_error_entry(buf, offset)``
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
        elif tag == TAG_ERROR and end - pos >= ERROR_ENTRY.size:
            try:
                item_id, deadline, _reasons, after = decode_error_entry(buf, pos, where)
            except CorruptionError:
                break
            yield "error", item_id, deadline, pos, ""
            pos = after
        else:
            break
    if pos != end:
        raise CorruptionError("malformed item metadata", file=where, offset=pos)


def sidecar_offsets(meta: bytes, where: str) -> dict[int, int]:
    """id -> offset of the newest error entry of each id in a log's metadata."""
    found: dict[int, int] = {}
    for kind, item_id, _deadline, offset, _text in decode_meta(meta, where):
        if kind == "error":
            found[item_id] = offset
    return found


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
        #: item id -> the key that names it (the items ``keys`` names, and only those)
        self.key_of: dict[int, str] = {}
        self._order: deque[tuple[int, str]] = deque()  # (time, key), oldest first
        self.origins: dict[int, str] = {}
        #: the reasons of items that failed (``storage/reasons.py``)
        self.errors = ItemErrors()
        #: schedule id -> its progress (``storage/schedules.py``)
        self.fired: dict[int, Fired] = {}
        #: when sidecars were last checked for expired keys (ms)
        self.sidecars_checked = 0

    # -------------------------------------------------------------- keys

    def lookup(self, key: str, now: int, window: int) -> Remembered | None:
        self.prune(now, window)
        return self.keys.get(key)

    def remember(self, key: str, entry: Remembered) -> None:
        old = self.keys.get(key)
        if old is not None and old is not entry and self.key_of.get(old.id) == key:
            del self.key_of[old.id]
        self.keys[key] = entry
        if entry.id:
            self.key_of[entry.id] = key
        self._order.append((entry.time, key))

    def forget_key(self, key: str) -> None:
        """The key names no item any more (its item was cancelled by key)."""
        entry = self.keys.pop(key, None)
        if entry is not None and self.key_of.get(entry.id) == key:
            del self.key_of[entry.id]

    def key_naming(self, item_id: int) -> tuple[str, Remembered] | None:
        """The key that names item ``item_id`` now, with its entry (None: no key does)."""
        key = self.key_of.get(item_id)
        if key is None:
            return None
        entry = self.keys.get(key)
        if entry is None or entry.id != item_id:
            return None
        return key, entry

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
                self.forget_key(key)

    def prune(self, now: int, window: int) -> None:
        order, keys = self._order, self.keys
        limit = now - window
        while order and order[0][0] <= limit:
            time, key = order.popleft()
            entry = keys.get(key)
            if entry is not None and entry.time == time and entry.pending is None:
                self.forget_key(key)

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

    def load(
        self,
        buf: bytes,
        where: str,
        now: int,
        window: int,
        log: int = 0,
        in_sidecar: bool = False,
    ) -> bool:
        """Take what a durable record or sidecar says (of log ``log``: a sidecar's
        error entries are left on disk, a log's kept in memory until it is frozen);
        True if it holds anything still worth keeping: an origin, a schedule's progress,
        reasons, a key within its window. Later entries win over earlier ones."""
        has_origin = False
        errors = self.errors
        for kind, item_id, deadline, time, text in decode_meta(buf, where):
            if kind == "origin":
                self.origins[item_id] = _intern(text)
                has_origin = True
            elif kind == "schedule":
                self._load_fired(item_id, deadline, time)
                has_origin = True
            elif kind == "group":
                continue  # the memseg and the segment files hold groups
            elif kind == "error":
                if in_sidecar:
                    errors.loaded(item_id, deadline, log, time, None)
                else:
                    reasons = decode_error_entry(buf, time, where)[2]
                    errors.loaded(item_id, deadline, log, -1, reasons)
                has_origin = True
            elif window > 0 and time > now - window:
                has_origin = True  # a key within its window: kept (a later one may win)
                known = self.keys.get(text)
                if known is None or known.time <= time:
                    if item_id == 0:
                        self.forget_key(text)
                    else:
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
            no, meta = read_sidecar(path)
            if not self.load(meta, path, now, window, no, True):
                fileio.remove(path)
        for path in logs:
            contents = read_wal(path)
            for _off, meta in contents.meta:
                self.load(meta, path, now, window, contents.segment_no)
        self._order = deque(sorted(self._order))

    def frozen(self, directory: str, log: int) -> dict[int, int] | None:
        """Where the error entries of log ``log`` are in its sidecar (id -> offset),
        read without the queue lock once the log is frozen; None if no item's newest
        reasons are in it (nothing to read). ``errors.frozen`` takes the answer."""
        if log not in self.errors.by_log:
            return None
        path = os.path.join(directory, sidecar_name(log))
        try:
            _no, meta = read_sidecar(path)
        except (OSError, CorruptionError):
            return None  # the texts stay in memory: nothing is lost
        return sidecar_offsets(meta, path)

    def prune_sidecars(self, directory: str, now: int, window: int, in_use: set[int]) -> int:
        """Delete sidecars whose keys are all expired and that name no origin, no
        schedule's latest durable tick and no item's newest reasons (``in_use``: the
        logs ``errors.logs_in_use`` named under the queue lock). (A tick older than its
        schedule's durable one is superseded by a later record, whose log, or sidecar
        once frozen, stays.)"""
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
                no, meta = read_sidecar(path)
            except (OSError, CorruptionError):
                continue
            keep = no in in_use
            for kind, item_id, deadline, time, _t in decode_meta(meta, path):
                if keep:
                    break
                if kind == "schedule":
                    f = self.fired.get(item_id)
                    if f is not None and deadline >= f.durable_tick:
                        keep = True
                        break
                elif kind == "group":
                    continue
                elif kind == "error":
                    continue  # kept while in use (above)
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
