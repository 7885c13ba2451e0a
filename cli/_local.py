"""What the commands that open a data directory themselves share: one clear line (not a
traceback) when the directory is missing, not a directory, or in use by a server."""

from __future__ import annotations

import fcntl
import os

__all__ = ["data_dir_problem"]


def data_dir_problem(path: str, *, must_exist: bool) -> str | None:
    """Why ``path`` cannot be opened as a data directory now, or None if it can."""
    if not os.path.exists(path):
        if must_exist:
            return f"{path}: no such data directory"
        return None
    if not os.path.isdir(path):
        return f"{path}: not a directory"
    lock = os.path.join(path, "LOCK")
    if not os.path.exists(lock):
        return None
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        return f"{path}: cannot open its LOCK file: {exc.strerror}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return (
            f"{path}: the data directory is in use by another process (a running dq serve?); "
            "stop it first, or use the running server over HTTP"
        )
    finally:
        os.close(fd)  # closing drops the lock if we took it
    return None
