"""A queue's timers: a call later (a failed freeze tried again, a dead letter moved
again), unless the queue closed by then.

Invariant: once ``close`` has run (under the queue's lock), no timer calls its function:
the pending ones are cancelled, and one already firing sees the queue closed under the
same lock before it calls anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["Timers"]


class Timers:
    """The timers of one queue; ``lock`` is the queue's."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._timers: set[threading.Timer] = set()
        self._closed = False

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` after ``delay`` seconds on a timer thread, unless the queue has
        closed by then (closing cancels the timer)."""

        def run() -> None:
            with self._lock:
                self._timers.discard(timer)
                if self._closed:
                    return
            fn()

        timer = threading.Timer(delay, run)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def close(self) -> None:
        """The queue closes: cancel every timer (call under the queue's lock)."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
