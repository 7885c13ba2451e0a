"""Why an item failed: its last error, when it happened, and a bounded history.

A consumer that fails an item (``POST .../fail``) says why; a lease that runs out says
"lease expired". The item keeps its reasons, newest first, at most ``MAX_REASONS`` — the
last one whole (up to ``MAX_ERROR_BYTES`` of UTF-8), the older ones cut to
``OLDER_REASON_BYTES`` — through restarts, merges, dead-lettering and redrive: the next
delivery, a peek, a browse and the dead-letter queue show them.

Durability: reasons are item metadata (``storage/itemmeta.py``), an *error entry* in the
same log record as the pending entry they belong to. Every record that writes a new
pending entry for an item with reasons (a fail, an expired lease, a requeue, a move by
key, a dead letter's or a redrive's copy) carries the item's reasons again, naming its
new deadline, so the newest error entry of an id always names where the item is::

    error entry: 05 | version u8 (1) | id u64 | deadline u64 | count u8 (1..5)
                 | count x (time u64 | delivery u32 | length u16 | text UTF-8)

Memory: an item's reasons are held in memory only while the log they were written in is
not frozen (that log's size bounds them); once its metadata is in a sidecar
(``NNNNNNNNNN.meta``) only where they are is kept (an ``ErrorNote``: about 280 bytes an
item, whatever the text), and a delivery or a peek reads them back from the sidecar with
one ``pread``. A note is dropped once its item is gone — released (its key falls behind
the dequeue cursor without a lease), deleted, purged or moved — which ``prune`` finds a
bounded number at a time; a sidecar is kept while a note points into it.
"""

from __future__ import annotations

import os
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from dq.storage.errors import CorruptionError, OutOfRange
from dq.storage.sidecar import SIDECAR_HEADER, sidecar_name

__all__ = [
    "ERROR_ENTRY",
    "ERROR_VERSION",
    "LEASE_EXPIRED",
    "MAX_ERROR_BYTES",
    "MAX_REASONS",
    "OLDER_REASON_BYTES",
    "REASON",
    "TAG_ERROR",
    "ErrorNote",
    "ItemErrors",
    "Reason",
    "check_error",
    "decode_error_entry",
    "encode_error_entry",
    "with_reason",
]

TAG_ERROR = 5
ERROR_VERSION = 1
#: tag, version, id, deadline, number of reasons
ERROR_ENTRY = struct.Struct(">BBQQB")
assert ERROR_ENTRY.size == 19
#: time, delivery, text length
REASON = struct.Struct(">QIH")
assert REASON.size == 14
#: the longest error text a consumer may give (bytes of UTF-8)
MAX_ERROR_BYTES = 4096
#: reasons an item keeps, newest first
MAX_REASONS = 5
#: an older reason is cut to this many bytes (the newest is kept whole)
OLDER_REASON_BYTES = 512
#: the reason an expired lease records
LEASE_EXPIRED = "lease expired"
#: the most an error entry can take: its head and every reason at its longest
_MAX_ENTRY = (
    ERROR_ENTRY.size
    + MAX_REASONS * REASON.size
    + MAX_ERROR_BYTES
    + ((MAX_REASONS - 1) * OLDER_REASON_BYTES)
)


@dataclass(frozen=True, slots=True)
class Reason:
    """One failure: the error text, when it happened (ms), and which delivery failed."""

    error: str
    at: int
    delivery: int


def check_error(text: object, index: int | None = None) -> str:
    """The error text of a fail, or ``OutOfRange`` (422) saying what to fix."""
    where = "" if index is None else f"items.{index}: "
    if not isinstance(text, str):
        raise OutOfRange(f"{where}error must be text", "error")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise OutOfRange(f"{where}error must be valid UTF-8 text", "error") from None
    if size > MAX_ERROR_BYTES:
        raise OutOfRange(
            f"{where}error must be at most {MAX_ERROR_BYTES} bytes of UTF-8 (it is {size})",
            "error",
        )
    return text


def _cut(text: str, limit: int) -> bytes:
    """``text`` as UTF-8, cut to ``limit`` bytes at a character boundary."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", "ignore").encode("utf-8")


def with_reason(reasons: Iterable[Reason], newest: Reason) -> tuple[Reason, ...]:
    """``newest`` before ``reasons``, the history bounded: at most ``MAX_REASONS``, the
    older ones cut to ``OLDER_REASON_BYTES`` (as their error entry stores them)."""
    out = [newest]
    for r in reasons:
        if len(out) == MAX_REASONS:
            break
        out.append(Reason(_cut(r.error, OLDER_REASON_BYTES).decode("utf-8"), r.at, r.delivery))
    return tuple(out)


def encode_error_entry(item_id: int, deadline: int, reasons: tuple[Reason, ...]) -> bytes:
    """The error entry of item ``item_id`` at ``deadline`` (reasons newest first)."""
    parts = [ERROR_ENTRY.pack(TAG_ERROR, ERROR_VERSION, item_id, deadline, len(reasons))]
    for n, r in enumerate(reasons[:MAX_REASONS]):
        raw = _cut(r.error, MAX_ERROR_BYTES if n == 0 else OLDER_REASON_BYTES)
        parts.append(REASON.pack(r.at, r.delivery, len(raw)))
        parts.append(raw)
    return b"".join(parts)


def decode_error_entry(
    buf: bytes, pos: int, where: str = "<metadata>"
) -> tuple[int, int, tuple[Reason, ...], int]:
    """(id, deadline, reasons, end) of the error entry at ``pos``; ``CorruptionError``
    if it is cut short or of a version this reader does not know."""
    end = len(buf)
    if end - pos < ERROR_ENTRY.size:
        raise CorruptionError("error entry cut short", file=where, offset=pos)
    tag, version, item_id, deadline, n = ERROR_ENTRY.unpack_from(buf, pos)
    if tag != TAG_ERROR or version != ERROR_VERSION or not 1 <= n <= MAX_REASONS:
        raise CorruptionError("not an error entry dq can read", file=where, offset=pos)
    at = pos + ERROR_ENTRY.size
    reasons: list[Reason] = []
    for _ in range(n):
        if end - at < REASON.size:
            raise CorruptionError("error entry cut short", file=where, offset=pos)
        time, delivery, length = REASON.unpack_from(buf, at)
        at += REASON.size
        if at + length > end:
            raise CorruptionError("error entry cut short", file=where, offset=pos)
        reasons.append(Reason(buf[at : at + length].decode("utf-8", "replace"), time, delivery))
        at += length
    return item_id, deadline, tuple(reasons), at


class ErrorNote:
    """Where an item's reasons are: in memory (``reasons``) while the log holding them
    is not frozen, else at ``offset`` in the metadata of log ``log``'s sidecar."""

    __slots__ = ("deadline", "log", "offset", "reasons")

    def __init__(
        self, deadline: int, log: int, offset: int, reasons: tuple[Reason, ...] | None
    ) -> None:
        #: the deadline of the item's pending entry the reasons were written with
        self.deadline = deadline
        self.log = log
        self.offset = offset
        self.reasons = reasons


#: notes ``prune`` looks at in one call, at most
PRUNE_BATCH = 32


class ItemErrors:
    """One queue's items that carry reasons (guarded by the queue lock)."""

    def __init__(self) -> None:
        self.notes: dict[int, ErrorNote] = {}
        #: log number -> ids whose newest error entry is in that log
        self.by_log: dict[int, set[int]] = {}
        #: ids ``prune`` looks at next (each live note comes round again)
        self._sweep: deque[int] = deque()

    def __len__(self) -> int:
        return len(self.notes)

    def _place(self, item_id: int, note: ErrorNote) -> None:
        old = self.notes.get(item_id)
        if old is not None:
            self._unlink(item_id, old)
        else:
            self._sweep.append(item_id)
        self.notes[item_id] = note
        self.by_log.setdefault(note.log, set()).add(item_id)

    def _unlink(self, item_id: int, note: ErrorNote) -> None:
        ids = self.by_log.get(note.log)
        if ids is not None:
            ids.discard(item_id)
            if not ids:
                del self.by_log[note.log]

    def written(self, item_id: int, deadline: int, log: int, reasons: tuple[Reason, ...]) -> None:
        """A record of log ``log`` gives item ``item_id`` (at ``deadline``) these reasons."""
        self._place(item_id, ErrorNote(deadline, log, -1, reasons))

    def loaded(
        self,
        item_id: int,
        deadline: int,
        log: int,
        offset: int,
        reasons: tuple[Reason, ...] | None,
    ) -> None:
        """An error entry read back: from a sidecar (``offset`` into its metadata, the
        reasons left on disk) or from a log not frozen yet (the reasons in memory)."""
        self._place(item_id, ErrorNote(deadline, log, offset, reasons))

    def put_back(self, item_id: int, note: ErrorNote | None) -> None:
        """Make ``note`` item ``item_id``'s again (a write that replaced it was refused)."""
        self.forget(item_id)
        if note is not None:
            self._place(item_id, note)

    def forget(self, item_id: int) -> None:
        note = self.notes.pop(item_id, None)
        if note is not None:
            self._unlink(item_id, note)

    def reasons(self, directory: str, item_id: int) -> tuple[Reason, ...] | None:
        """Item ``item_id``'s reasons, newest first (None: it has none); read from the
        sidecar when they are not in memory."""
        note = self.notes.get(item_id)
        if note is None:
            return None
        if note.reasons is not None:
            return note.reasons
        return read_reasons(directory, note.log, note.offset)

    def frozen(self, log: int, found: dict[int, int]) -> None:
        """Log ``log``'s metadata is in its sidecar now, the error entries at ``found``
        (id -> offset, ``sidecar_offsets``): let go of the texts written in it."""
        for item_id in self.by_log.get(log, ()):
            note = self.notes[item_id]
            offset = found.get(item_id)
            if offset is not None and note.log == log:
                note.offset, note.reasons = offset, None

    def logs_in_use(self) -> set[int]:
        """Logs whose sidecars hold some item's newest reasons (kept while so)."""
        return set(self.by_log)

    def next_to_check(self, limit: int = PRUNE_BATCH) -> list[int]:
        """Up to ``limit`` ids whose notes ``prune`` checks now (round robin)."""
        out: list[int] = []
        sweep, notes = self._sweep, self.notes
        for _ in range(len(sweep)):  # each id looked at once at most; forgotten ones drop
            if len(out) == limit:
                break
            item_id = sweep.popleft()
            if item_id in notes:
                out.append(item_id)
                sweep.append(item_id)
        return out


def read_reasons(directory: str, log: int, offset: int) -> tuple[Reason, ...] | None:
    """The reasons of the error entry at ``offset`` in log ``log``'s sidecar (one
    ``pread``); None if the sidecar cannot be read (it is logged by the caller's view:
    a delivery goes on without its reasons rather than fail)."""
    path = os.path.join(directory, sidecar_name(log))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = os.pread(fd, _MAX_ENTRY, SIDECAR_HEADER.size + offset)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        return decode_error_entry(raw, 0, path)[2]
    except CorruptionError:
        return None
