"""All file I/O of the engine goes through this module, so tests can inject faults.

The durability rules live here once: new files are written under a temporary name,
fsynced, renamed into place, and the directory is fsynced; nothing is published in
memory before that. ``FAULTS`` is a hook list: a test installs a callable that sees
every step (``write``, ``fsync``, ``rename``, ``unlink`` ...) with its path and may
raise to simulate a crash or ENOSPC at exactly that point.

``POWER`` is the simulated power-loss layer (``dq.storage.powerloss``): when a test
installs one, every mutating step is recorded so that a simulated crash can roll the
files back to what was durable. When it is ``None`` (always, outside tests) each step
pays one global lookup.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from dq.storage import _wal
from dq.storage.errors import StorageFull

if TYPE_CHECKING:
    from dq.storage.powerloss import PowerLoss

__all__ = [
    "FAULTS",
    "POWER",
    "allocate",
    "create",
    "fdatasync",
    "fsync",
    "fsync_dir",
    "open_for_write",
    "pread",
    "pwrite_all",
    "pwrite_and_sync",
    "remove",
    "rename",
    "simulate_power_loss",
    "step",
    "truncate",
    "write_all",
    "write_file_atomic",
]

FaultHook = Callable[[str, str], None]
#: Installed by tests; each hook is called as hook(step, path) before the step runs.
FAULTS: list[FaultHook] = []
#: Installed by tests (``simulate_power_loss``): tracks what a power loss would keep.
POWER: PowerLoss | None = None


def step(name: str, path: str) -> None:
    """Announce a step to the fault hooks (a no-op in production)."""
    for hook in FAULTS:
        hook(name, path)


def _raise_full(exc: OSError, path: str) -> None:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        raise StorageFull("no space left on device", file=path) from exc


@contextmanager
def simulate_power_loss(root: str, *, sync_to_disk: bool = False) -> Iterator[PowerLoss]:
    """Install the power-loss layer for the files under ``root`` (tests only)."""
    global POWER
    from dq.storage.powerloss import PowerLoss

    if POWER is not None:
        raise RuntimeError("a power-loss layer is already installed")
    layer = PowerLoss(root, sync_to_disk=sync_to_disk)
    POWER = layer
    try:
        yield layer
    finally:
        POWER = None
        layer.close()


def write_all(fd: int, data: bytes | bytearray | memoryview, path: str) -> None:
    """Write all of ``data`` at the file position; ENOSPC becomes ``StorageFull``."""
    try:
        step("write", path)
        power = POWER
        if power is None:
            _write_all(fd, data)
            return
        with power.lock:
            if not power.dead:
                power.before_write(fd, None, len(data))
                _write_all(fd, data)
    except OSError as exc:
        _raise_full(exc, path)
        raise


def _write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync(fd: int, path: str) -> None:
    step("fsync", path)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                if power.sync_to_disk:
                    os.fsync(fd)
                power.synced(fd)
        return
    os.fsync(fd)


def fdatasync(fd: int, path: str) -> None:
    step("fsync", path)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                if power.sync_to_disk:
                    _wal.fdatasync(fd)
                power.synced(fd)
        return
    _wal.fdatasync(fd)


def fsync_dir(path: str) -> None:
    step("fsync_dir", path)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                if power.sync_to_disk:
                    _fsync_dir(path)
                power.dir_synced(path)
        return
    _fsync_dir(path)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rename(src: str, dst: str) -> None:
    step("rename", dst)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                power.before_unlink(dst)  # a replaced file may come back
                os.replace(src, dst)
        return
    os.replace(src, dst)


def remove(path: str) -> None:
    step("unlink", path)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                power.before_unlink(path)
                _remove(path)
        return
    _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def truncate(fd: int, size: int, path: str) -> None:
    step("truncate", path)
    power = POWER
    if power is not None:
        with power.lock:
            if not power.dead:
                power.before_truncate(fd, size)
                os.ftruncate(fd, size)
        return
    os.ftruncate(fd, size)


def pread(fd: int, size: int, offset: int) -> bytes:
    data = os.pread(fd, size, offset)
    return data


def open_for_write(path: str) -> int:
    """Open an existing file for positioned writes (``pwrite_all``)."""
    step("open", path)
    return os.open(path, os.O_WRONLY | os.O_CLOEXEC)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int, path: str) -> None:
    """Write all of ``data`` at ``offset`` (the file position is not used); ENOSPC
    becomes ``StorageFull``."""
    try:
        step("write", path)
        power = POWER
        if power is None:
            _pwrite_all(fd, data, offset)
            return
        with power.lock:
            if not power.dead:
                power.before_write(fd, offset, len(data))
                _pwrite_all(fd, data, offset)
    except OSError as exc:
        _raise_full(exc, path)
        raise


#: what ``posix_fallocate`` answers on a file system that cannot allocate ahead
_CANNOT_ALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EINVAL})


def allocate(fd: int, offset: int, length: int, path: str) -> bool:
    """Give the file blocks for ``length`` bytes from ``offset``, growing its size, without
    writing them (they read as zeros): a log grows ahead of its records this way, so the
    ``fdatasync`` of a later record has no file size to record — on ext4 one journal
    commit, a wait on the journal's own thread, fewer per durable round. ENOSPC becomes
    ``StorageFull``; a power loss before the next sync takes the growth back. False, with
    nothing changed, where the file system cannot allocate ahead: the caller appends
    plainly, which is only slower."""
    try:
        step("allocate", path)
        power = POWER
        if power is None:
            os.posix_fallocate(fd, offset, length)
            return True
        with power.lock:
            if not power.dead:
                power.before_write(fd, offset, length)
                os.posix_fallocate(fd, offset, length)
        return True
    except OSError as exc:
        if exc.errno in _CANNOT_ALLOCATE:
            return False
        _raise_full(exc, path)
        raise


def _pwrite_all(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    _wal.pwrite_all(fd, data, offset)


def pwrite_and_sync(
    fd: int, data: bytes | bytearray | memoryview, offset: int, path: str
) -> Exception | None:
    """``pwrite_all`` then ``fdatasync``: a durable group commit round's two steps.

    The write's failure is raised (``StorageFull`` for a full disk) and nothing is
    synced; the sync's failure is *returned* (the write was done: the caller's offset
    moves past it), None when both are done. With no fault hook and no power-loss layer
    installed (always, outside tests) both system calls are one compiled call with the
    GIL released once, so no other thread's Python runs between them; when a test
    watches, each step is announced and taken on its own, through the same compiled
    system calls.
    """
    if FAULTS or POWER is not None:
        pwrite_all(fd, data, offset, path)
        try:
            fdatasync(fd, path)
        except Exception as exc:
            return exc
        return None
    try:
        err = _wal.pwrite_fdatasync(fd, data, offset)
    except OSError as exc:
        _raise_full(exc, path)
        raise
    return OSError(err, os.strerror(err), path) if err else None


def create(path: str) -> int:
    """Create (or empty) a file for writing; a step, so tests can refuse it (EMFILE)."""
    try:
        step("create", path)
        power = POWER
        if power is None:
            return _create(path)
        with power.lock:
            if power.dead:  # a dead process creates nothing
                return os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
            power.before_create(path)
            return _create(path)
    except OSError as exc:
        _raise_full(exc, path)
        raise


def _create(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


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
