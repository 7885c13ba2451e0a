"""Unpacking a leader's snapshot (a tar stream) into a directory the engine can install.

A follower that (re)joins fetches the leader's snapshot (``POST /v1/replica/snapshot``)
and replaces its queues with it. The tar comes over the network, so it is unpacked as
untrusted input: only regular files and directories, only under ``snapshot.json`` and
``queues/``, no absolute names, no ``..`` (tarfile's ``data`` filter, then ours). It is
unpacked into a fresh directory *inside* the data directory, so the engine's install is
a rename on the same file system, and every file and directory is fsynced before the
caller installs it: a follower acknowledges frames on top of the snapshot, so the
snapshot must be as durable as those frames.

Directories left behind by a crash mid-transfer are named ``.replica-snapshot-*`` and
removed by ``remove_leftovers`` (never a queue's name: those cannot start with a dot).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Self

from dq.storage import fileio

__all__ = [
    "PREFIX",
    "BadSnapshot",
    "SnapshotInfo",
    "remove_leftovers",
    "unpack_snapshot",
]

PREFIX = ".replica-snapshot-"
MANIFEST = "snapshot.json"
_TOP_LEVEL = frozenset({MANIFEST, "queues"})
_END_SEEN = "_dq_end_marker_seen"
#: padding after the end-of-archive marker (tar writers fill their last record)
_MAX_TRAILER = 1 << 20


class BadSnapshot(Exception):
    """The snapshot stream is not a well-formed, safe snapshot."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    """``snapshot.json``: the leader's epoch, the lsn the snapshot is consistent with
    (``lsn``), and per queue the last lsn its copy includes."""

    epoch: int
    lsn: int
    queues: dict[str, int]

    def covers(self, queue: str, lsn: int) -> bool:
        """True if the frame ``(queue, lsn)`` is already inside the snapshot."""
        return lsn <= self.queues.get(queue, self.lsn)


def _nonneg_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def parse_manifest(raw: bytes) -> SnapshotInfo:
    try:
        doc = json.loads(raw)
        epoch, lsn, queues = doc["epoch"], doc["lsn"], doc["queues"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BadSnapshot(f"unreadable {MANIFEST}: {exc}") from exc
    if not (_nonneg_int(epoch) and _nonneg_int(lsn) and isinstance(queues, dict)):
        raise BadSnapshot(f"bad {MANIFEST}: {doc!r}")
    if not all(isinstance(q, str) and _nonneg_int(n) for q, n in queues.items()):
        raise BadSnapshot(f"bad queue lsns in {MANIFEST}: {queues!r}")
    return SnapshotInfo(epoch, lsn, dict(queues))


class _EndMarked(tarfile.TarInfo):
    """Notes on the archive when it ends at its end-of-archive marker (a zero block).

    tarfile ends a stream quietly at *any* missing or damaged header, so an archive cut
    at a member boundary would look complete; the marker is what tells them apart.
    """

    @classmethod
    def fromtarfile(cls, archive: tarfile.TarFile) -> Self:
        try:
            return super().fromtarfile(archive)
        except tarfile.HeaderError as exc:
            if type(exc).__name__ == "EOFHeaderError":  # a zero block (not in the stubs)
                setattr(archive, _END_SEEN, True)
            raise


def _data_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """tarfile's ``data`` filter, or where Python lacks it (before 3.11.4 and 3.12:
    Debian 12's python3 is 3.11.2) the part of it a snapshot's members need: no absolute
    name, nothing above ``dest``, no set-id or group/other write bits."""
    if hasattr(tarfile, "data_filter"):
        try:
            return tarfile.data_filter(member, dest)
        except tarfile.FilterError as exc:
            raise BadSnapshot(f"unsafe member {member.name!r}: {exc}") from exc
    name = os.path.normpath(member.name)
    if os.path.isabs(member.name) or name.split(os.sep)[0] == os.pardir:
        raise BadSnapshot(f"unsafe member {member.name!r}: outside the snapshot")
    member.mode &= 0o755
    return member


def _extract(
    tar: tarfile.TarFile,
    dest: str,
    member_filter: Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None],
) -> None:
    """``extractall`` with ``member_filter``; member by member where ``extractall`` has
    no ``filter`` argument (the Pythons ``_data_filter`` stands in for)."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter=member_filter)
        return
    for member in tar:
        safe = member_filter(member, dest)
        if safe is not None:
            tar.extract(safe, dest)


def _safe_member(
    check: Callable[[], None],
) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo | None]:
    """The extraction filter: ``check`` runs first (it may stop the transfer)."""

    def member_filter(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        check()
        if member.isdir() and os.path.normpath(member.name) == ".":
            return None  # the archive's own root: ``dest`` exists already
        if not (member.isreg() or member.isdir()):
            raise BadSnapshot(f"not a regular file or directory: {member.name!r}")
        safe = _data_filter(member, dest)  # absolute names, "..", odd modes
        parts = os.path.normpath(safe.name).split(os.sep)
        if parts[0] not in _TOP_LEVEL or (parts[0] == MANIFEST and len(parts) > 1):
            raise BadSnapshot(f"unexpected member {member.name!r}")
        if parts[0] == MANIFEST and not member.isreg():
            raise BadSnapshot(f"{MANIFEST} is not a file")
        return safe

    return member_filter


def _read_padding(stream: IO[bytes]) -> None:
    seen = 0
    while chunk := stream.read(64 * 1024):
        seen += len(chunk)
        if seen > _MAX_TRAILER or chunk.strip(b"\0"):
            raise BadSnapshot("data after the end of the snapshot archive")


def _sync_tree(root: str) -> None:
    """fsync every file, then every directory bottom-up, then ``root``'s parent."""
    for path, _dirs, files in os.walk(root, topdown=False):
        for name in files:
            full = os.path.join(path, name)
            fd = os.open(full, os.O_RDONLY | os.O_CLOEXEC)
            try:
                fileio.fsync(fd, full)
            finally:
                os.close(fd)
        fileio.fsync_dir(path)
    fileio.fsync_dir(os.path.dirname(root))


def unpack_snapshot(
    stream: IO[bytes], data_dir: str, check: Callable[[], None] = lambda: None
) -> tuple[str, SnapshotInfo]:
    """Unpack the tar ``stream`` into a new directory in ``data_dir``, durably.

    Returns that directory (holding ``snapshot.json`` and ``queues/``) and the parsed
    manifest; the caller installs it and removes the directory. ``check`` is called
    before each member: it raises to abandon the transfer. On any failure nothing is
    left behind and ``BadSnapshot`` (bad content), ``tarfile.TarError`` (a broken
    stream) or ``OSError`` (the disk, the network) is raised.
    """
    dest = tempfile.mkdtemp(prefix=PREFIX, dir=data_dir)
    try:
        with tarfile.open(fileobj=stream, mode="r|", tarinfo=_EndMarked) as tar:
            _extract(tar, dest, _safe_member(check))
            if not getattr(tar, _END_SEEN, False):
                raise BadSnapshot("the snapshot stream ended without the end-of-archive marker")
        # the rest is padding; reading it to the end lets the HTTP framing (chunked or
        # Content-Length) tell a complete body from a connection cut short
        _read_padding(stream)
        try:
            with open(os.path.join(dest, MANIFEST), "rb") as f:
                info = parse_manifest(f.read())
        except FileNotFoundError:
            raise BadSnapshot(f"no {MANIFEST} in the snapshot") from None
        os.makedirs(os.path.join(dest, "queues"), exist_ok=True)  # a leader with no queue
        _sync_tree(dest)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest, info


def remove_leftovers(data_dir: str) -> None:
    """Remove snapshot directories a crash left in ``data_dir``."""
    try:
        names = os.listdir(data_dir)
    except FileNotFoundError:
        return
    for name in names:
        if name.startswith(PREFIX):
            shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)
