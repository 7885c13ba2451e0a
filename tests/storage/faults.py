"""Fault tools shared by the storage tests: one-shot I/O faults, crashes, the ack check.

- ``OneShot`` is a ``fileio.FAULTS`` hook that raises one ``OSError`` (ENOSPC, EIO,
  EMFILE ...) at the n-th step matching a step name and a file kind, then never again:
  the fault clears, as a disk that was full gets space back.
- ``AckCheck`` checks, at the moment each batch is acknowledged in ``fsync="always"``,
  that its log record lies in the synced part of its log (``PowerLoss.durable``). It
  runs in the thread that resolves the future, before the caller can see the answer,
  so an engine that answers before its sync is caught every time, not by luck.
- ``crash_engine`` ends an engine the way a crash does (power loss or SIGKILL) and
  ``reopen`` starts the next one on what the crash left.
"""

from __future__ import annotations

import errno
import os
import random
import re
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

from dq.storage import Engine, EngineConfig, fileio
from dq.storage.powerloss import PowerLoss
from dq.storage.queue import Queue
from dq.storage.wal import RECORD_HEADER

__all__ = [
    "ERRORS",
    "AckCheck",
    "OneShot",
    "crash_engine",
    "file_kind",
    "phase_of",
]

ERRORS = {"ENOSPC": errno.ENOSPC, "EIO": errno.EIO, "EMFILE": errno.EMFILE}

_KINDS = (
    (re.compile(r"\d{10}\.log\.tmp$"), "log.tmp"),
    (re.compile(r"\d{10}\.log$"), "log"),
    (re.compile(r"\d{10}\.log_ro$"), "log_ro"),
    (re.compile(r"\d{10}-\d{10}\.seg\.tmp$"), "seg.tmp"),
    (re.compile(r"\d{10}-\d{10}\.seg$"), "seg"),
    (re.compile(r"queue\.json(\.tmp)?$"), "config"),
    (re.compile(r"\.torn-\d+(\.tmp)?$"), "torn"),
)


def file_kind(path: str) -> str:
    """What a path is to the engine: ``log``, ``log_ro``, ``seg.tmp``, ``dir`` ..."""
    for pattern, kind in _KINDS:
        if pattern.search(path):
            return kind
    if os.path.isdir(path):
        return "dir"
    return "other"


#: the engine function on the stack that names what a step belongs to, innermost first
_PHASES = (
    ("freeze_log", "freeze"),
    ("merge_segments", "merge"),
    ("_install_frozen", "install"),
    ("_install_merge", "install"),
    ("_retry_freeze", "install"),
    ("begin_rotation", "rotation"),
    ("end_rotation", "rotation"),
    ("recover_directory", "recovery"),
    ("_recover_locked", "recovery"),
    ("_load", "recovery"),
    ("open", "recovery"),
    ("create", "create"),
    ("sync_round", "append"),
    ("_submit", "append"),
    ("close", "close"),
)


def phase_of(skip: int = 2) -> str:
    """The phase of the engine's work the current step belongs to (from the stack)."""
    frame = sys._getframe(skip)
    names: list[str] = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    for fn, phase in _PHASES:
        if fn in names:
            return phase
    return "other"


class OneShot:
    """Raise ``OSError(err)`` at the ``nth`` step matching (phase, step, kind), once."""

    def __init__(self, phase: str, step: str, kind: str, err: int, nth: int = 1) -> None:
        self.phase, self.step, self.kind, self.err = phase, step, kind, err
        self.left = nth
        self.fired: str | None = None
        self._lock = threading.Lock()

    def __call__(self, step: str, path: str) -> None:
        if step != self.step or self.fired is not None or file_kind(path) != self.kind:
            return
        if phase_of() != self.phase:
            return
        with self._lock:
            if self.fired is not None:
                return
            self.left -= 1
            if self.left > 0:
                return
            self.fired = path
        raise OSError(self.err, os.strerror(self.err), path)

    @contextmanager
    def armed(self) -> Iterator[OneShot]:
        fileio.FAULTS.append(self)
        try:
            yield self
        finally:
            fileio.FAULTS.remove(self)


class Recorder:
    """A ``FAULTS`` hook that records every (phase, step, kind) it sees."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, str]] = set()

    def __call__(self, step: str, path: str) -> None:
        self.seen.add((phase_of(), step, file_kind(path)))


class AckCheck:
    """Record a violation whenever a batch is acknowledged before its record is synced."""

    def __init__(self, power: PowerLoss) -> None:
        self.power = power
        self.violations: list[str] = []
        self.checked = 0
        self._original: Callable[..., Any] | None = None

    def _check(
        self, fut: Future[Any], key: tuple[int, int], start: int, end: int, path: str
    ) -> None:
        if fut.cancelled() or fut.exception() is not None or self.power.dead:
            return
        self.checked += 1
        if not self.power.durable(key, start, end):
            self.violations.append(f"{path}: bytes {start}..{end} acknowledged before synced")

    def install(self) -> None:
        original = self._original = Queue._submit
        check = self._check

        def _submit(q: Queue, batch: Any, payload: bytes, *args: Any, **kwargs: Any) -> Future[Any]:
            wal = q.commit.wal
            st = os.fstat(wal._fd)
            start = wal.size  # the record goes after everything appended so far
            end = start + RECORD_HEADER.size + len(payload)
            fut: Future[Any] = original(q, batch, payload, *args, **kwargs)
            if q.engine.config.fsync == "always":
                key = (st.st_dev, st.st_ino)
                fut.add_done_callback(lambda f: check(f, key, start, end, wal.path))
            return fut

        Queue._submit = _submit  # type: ignore[method-assign]

    def uninstall(self) -> None:
        if self._original is not None:
            Queue._submit = self._original  # type: ignore[method-assign]
            self._original = None

    def __enter__(self) -> AckCheck:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()


def crash_engine(
    engine: Engine,
    power: PowerLoss,
    *,
    power_loss: bool,
    rng: random.Random | None = None,
) -> None:
    """End ``engine`` as a crash would: the disk keeps what the crash keeps, nothing
    the dying engine does afterwards reaches it. Then power comes back."""
    if power_loss:
        power.crash(rng)
    else:
        power.kill()
    try:
        engine.close()
    except Exception:  # a failed queue may complain on its way down; the disk is fixed
        pass
    power.power_on()


def reopen(path: str, config: EngineConfig, **kwargs: Any) -> Engine:
    return Engine.open(path, config, **kwargs)
