"""All file I/O of the engine goes through this module, so tests can inject faults.

The durability rules live here once: new files are written under a temporary name,
fsynced, renamed into place, and the directory is fsynced; nothing is published in
memory before that. ``FAULTS`` is a hook list: a test installs a callable that sees
every step (``write``, ``fsync``, ``rename``, ``unlink`` ...) with its path and may
raise to simulate a crash or ENOSPC at exactly that point.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from dq.storage.errors import StorageFull

__all__ = [
    "FAULTS",
    "create",
    "fdatasync",
    "fsync",
    "fsync_dir",
    "open_for_write",
    "pread",
    "pwrite_all",
    "remove",
    "rename",
    "step",
    "truncate",
    "write_all",
    "write_file_atomic",
]

FaultHook = Callable[[str, str], None]
#: Installed by tests; each hook is called as hook(step, path) before the step runs.
FAULTS: list[FaultHook] = []


def step(name: str, path: str) -> None:
    """Announce a step to the fault hooks (a no-op in production)."""
    for hook in FAULTS:
        hook(name, path)


def _raise_full(exc: OSError, path: str) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise StorageFull("no space left on device", file=path) from exc


def write_all(fd: int, data: bytes | bytearray | memoryview, path: str) -> None:
    step("write", path)
    view = memoryview(data)
    try:
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as exc:
        _raise_full(exc, path)
        raise


def fsync(fd: int, path: str) -> None:
    step("fsync", path)
    os.fsync(fd)


def fdatasync(fd: int, path: str) -> None:
    step("fsync", path)
    os.fdatasync(fd)


def fsync_dir(path: str) -> None:
    step("fsync_dir", path)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename(src: str, dst: str) -> None:
    step("rename", dst)
    os.replace(src, dst)


def remove(path: str) -> None:
    step("unlink", path)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def truncate(fd: int, size: int, path: str) -> None:
    step("truncate", path)
    os.ftruncate(fd, size)


def pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    return data


def open_for_write(path: str) -> int:
    """Open an existing file for positioned writes (``pwrite_all``)."""
    step("open", path)
    return os.open(path, os.O_WRONLY | os.O_CLOEXEC)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int, path: str) -> None:
    """Write all of ``data`` at ``offset`` (the file position is not used)."""
    step("write", path)
    view = memoryview(data)
    try:
        while view:
            n = os.pwrite(fd, view, offset)
            view = view[n:]
            offset += n
    except OSError as exc:
        _raise_full(exc, path)
        raise


def create(path: str) -> int:
    """Create (or empty) a file for writing; a step, so tests can refuse it (EMFILE)."""
    step("create", path)
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        _raise_full(exc, path)
        raise


def write_file_atomic(path: str, data: bytes) -> None:
    """temp name → write → fsync → rename → fsync directory."""
    tmp = path + ".tmp"
    fd = create(tmp)
    try:
        write_all(fd, data, tmp)
        fsync(fd, tmp)
    finally:
        os.close(fd)
    rename(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")
