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
        timer = threading.Timer(delay, self._fire, (fn,))
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def _fire(self, fn: Callable[[], None]) -> None:
        """On the timer's own thread. The timer is found as that thread, not named in a
        closure it holds: such a closure made each timer a reference cycle, which kept
        ``fn`` — a part of the queue — and through it the closed queue's memory until
        the cycle collector ran."""
        with self._lock:
            self._timers.discard(threading.current_thread())  # type: ignore[arg-type]
            if self._closed:
                return
        fn()

    def close(self) -> None:
        """The queue closes: cancel every timer (call under the queue's lock)."""
        self._closed = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
