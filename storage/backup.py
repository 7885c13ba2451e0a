"""Online backup: a consistent copy of the data directory while the engine serves.

For each queue, under its lock (so no freeze, merge install or rotation is half done):
note the segment files in use, the closed logs not yet frozen, the current log and
how many of its bytes are written (``WalWriter.offset``: whole records only; every
acknowledged write is below it), and the small files (``queue.json``, ``state.json``,
metadata sidecars, schedule definitions). Segment files are immutable: they are
hard-linked (copied when the destination is on another file system), and logs are opened, so a merge or freeze
that deletes a file afterwards does not take it from the copy. The bytes are copied
after the lock is released, so writers wait only for the bookkeeping.

Everything is written under ``DEST.partial-<pid>``, fsynced, and renamed to ``DEST``
at the end: a directory named ``DEST`` is a complete backup. Restoring is starting a
server on it (``dq serve --data-dir DEST``): it recovers like after a crash — the
copied logs are replayed, leases are gone (items not released are delivered again).
"""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from dq.storage import fileio
from dq.storage.errors import InvalidArgument, QueueNotFound
from dq.storage.queue_state import STATE_FILE
from dq.storage.schedule_store import is_schedule_file

if TYPE_CHECKING:
    from dq.storage.queue import Queue

__all__ = ["BackupResult", "BackupSource", "backup"]


class BackupSource(Protocol):
    """What a backup reads of the engine: its data directory and its queues."""

    root: str

    def list_queues(self) -> list[str]: ...

    def queue(self, name: str) -> Queue: ...


_CHUNK = 1 << 20


@dataclass(slots=True)
class BackupResult:
    path: str
    bytes: int
    files: int
    queues: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Pending:
    """A file opened under the queue lock, to copy (``length`` bytes) afterwards."""

    fd: int
    dest: str
    length: int | None  # None: the whole file


def _copy_fd(fd: int, dest: str, length: int | None) -> int:
    out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    copied = 0
    try:
        while length is None or copied < length:
            want = _CHUNK if length is None else min(_CHUNK, length - copied)
            data = os.pread(fd, want, copied)
            if not data:
                break
            fileio.write_all(out, data, dest)
            copied += len(data)
        fileio.fsync(out, dest)
    finally:
        os.close(out)
    return copied


def _snapshot(q: Queue, qdest: str) -> tuple[list[_Pending], int, int]:
    """Link or open what the copy needs; call under the queue lock."""
    pending: list[_Pending] = []
    linked_bytes = files = 0
    names = os.listdir(q.directory)
    small = sorted(n for n in names if n.endswith(".meta") or is_schedule_file(n))
    for name in ("queue.json", STATE_FILE, *small):
        path = os.path.join(q.directory, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        pending.append(_Pending(fd, os.path.join(qdest, name), None))
    for reader in q.files.segments:
        dest = os.path.join(qdest, os.path.basename(reader.path))
        try:
            os.link(reader.path, dest)
            linked_bytes += reader.file_size
            files += 1
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            fd = os.open(reader.path, os.O_RDONLY | os.O_CLOEXEC)
            pending.append(_Pending(fd, dest, None))
    for path, _mem in q.files.frozen:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        pending.append(_Pending(fd, os.path.join(qdest, os.path.basename(path)), None))
    wal = q.commit.wal
    with wal.io_lock:
        if not wal.closed:
            fd = os.open(wal.path, os.O_RDONLY | os.O_CLOEXEC)
            pending.append(
                _Pending(fd, os.path.join(qdest, os.path.basename(wal.path)), wal.offset)
            )
    return pending, linked_bytes, files


def backup(engine: BackupSource, dest: str) -> BackupResult:
    """Copy every queue of ``engine`` to the new directory ``dest``."""
    dest = os.path.abspath(dest)
    if os.path.exists(dest):
        raise InvalidArgument(
            f"backup destination {dest} exists: give a path that does not exist yet", path=dest
        )
    parent = os.path.dirname(dest)
    if not os.path.isdir(parent):
        raise InvalidArgument(f"the directory {parent} does not exist: create it first", path=dest)
    if os.path.commonpath([dest, engine.root]) == engine.root:
        raise InvalidArgument("a backup cannot go inside the data directory", path=dest)
    work = f"{dest}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "queues"))
    result = BackupResult(dest, 0, 0)
    try:
        for name in engine.list_queues():
            try:
                q = engine.queue(name)
            except QueueNotFound:
                continue  # deleted meanwhile
            qdest = os.path.join(work, "queues", name)
            os.mkdir(qdest)
            with q.lock:
                if q.closed:
                    continue
                pending, linked, files = _snapshot(q, qdest)
            result.bytes += linked
            result.files += files
            try:
                for p in pending:
                    result.bytes += _copy_fd(p.fd, p.dest, p.length)
                    result.files += 1
            finally:
                for p in pending:
                    os.close(p.fd)
            fileio.fsync_dir(qdest)
            result.queues.append(name)
        fileio.fsync_dir(os.path.join(work, "queues"))
        fileio.fsync_dir(work)
        fileio.rename(work, dest)
        fileio.fsync_dir(parent)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return result
