"""A ``fileio.FAULTS`` hook that holds log fsyncs until the test lets each one go.

Used to run an operation while another write's record is on its way to disk (its
``fdatasync`` has started and not returned), deterministically: the test waits until
the sync is held, does what it wants to check, then lets it go. Unlike a sleep, nothing
depends on how fast a loaded machine runs the writer.

Only the group commit's syncs are held (``faults.phase_of``: "append"). A log closed
at rotation is synced under the queue lock: holding that sync would hold every
operation of the queue, the one the test wants to run meanwhile included.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dq.storage import fileio
from tests.storage.faults import phase_of

__all__ = ["SyncGate", "gated_syncs"]

#: how long a held fsync waits for the test before it fails the writer's thread
HOLD_LIMIT_S = 30.0
#: how long the test waits for a write to reach its fsync
ARRIVE_S = 10.0
#: how often a wait with a ``stop`` condition looks at it
STOP_POLL_S = 0.01


class SyncGate:
    """Holds every group-commit ``fsync`` of a ``*.log`` until a permit is given for it.

    ``arrived`` counts the fsyncs that reached the gate; ``let_one`` lets the next one
    through; ``open`` lets every later one through without stopping."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.arrived = 0
        self.paths: list[str] = []
        self._permits = 0
        self._open = False

    def __call__(self, step: str, path: str) -> None:
        if step != "fsync" or not path.endswith(".log") or phase_of() != "append":
            return
        with self._cond:
            if self._open:
                return
            self.arrived += 1
            self.paths.append(path)
            self._cond.notify_all()
            let_go = self._cond.wait_for(lambda: self._open or self._permits > 0, HOLD_LIMIT_S)
            assert let_go, "the test never let a held fsync go"
            if not self._open:
                self._permits -= 1

    def wait_arrived(
        self, n: int, timeout_s: float = ARRIVE_S, stop: Callable[[], bool] | None = None
    ) -> bool:
        """True once ``n`` fsyncs reached the gate (held or let through since); False
        after ``timeout_s``, or as soon as ``stop()`` says the wait is over (the write
        that was to sync ended without reaching the gate, refused for instance)."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while self.arrived < n:
                left = end - time.monotonic()
                if left <= 0 or (stop is not None and stop()):
                    return False
                self._cond.wait(min(left, STOP_POLL_S) if stop is not None else left)
            return True

    def let_one(self) -> None:
        with self._cond:
            self._permits += 1
            self._cond.notify_all()

    def open(self) -> None:
        with self._cond:
            self._open = True
            self._cond.notify_all()


@contextmanager
def gated_syncs() -> Iterator[SyncGate]:
    """Install a ``SyncGate``; on the way out it is opened and removed."""
    gate = SyncGate()
    fileio.FAULTS.append(gate)
    try:
        yield gate
    finally:
        gate.open()
        fileio.FAULTS.remove(gate)
