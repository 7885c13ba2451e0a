"""The compaction worker process: runs freeze and merge jobs sent by its parent.

Protocol on stdin/stdout (``storage/worker_wire.py``): each message is a 4-byte
big-endian length and a pickle.
The parent sends ``(job_id, function_name, args, kwargs)``; the worker answers
``(job_id, ok, result_or_exception)``. Only functions in ``JOBS`` can be named.

The worker must never outlive the server: it asks the kernel to SIGKILL it when its
parent dies (``PR_SET_PDEATHSIG``) and exits when stdin closes. A merge killed
half-way leaves only a ``*.tmp`` file, which the next open deletes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from dq.storage.compactor import freeze_log, merge_segments
from dq.storage.worker_wire import read_message, write_message

__all__ = ["JOBS"]

JOBS: dict[str, Callable[..., Any]] = {"freeze_log": freeze_log, "merge_segments": merge_segments}
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def main() -> None:
    _die_with_parent(int(sys.argv[1]) if len(sys.argv) > 1 else os.getppid())
    if len(sys.argv) > 2 and int(sys.argv[2]):
        os.nice(int(sys.argv[2]))  # merges: serving (and freezing) come first
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        msg = read_message(stdin)
        if msg is None:
            return
        job_id, name, args, kwargs = msg
        try:
            result = JOBS[name](*args, **kwargs)
            reply = (job_id, True, result)
        except Exception as exc:
            reply = (job_id, False, exc)
        write_message(stdout, reply)


if __name__ == "__main__":
    main()
