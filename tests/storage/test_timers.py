"""``Timers``, a queue's calls later, on their own: a call runs after its delay, and
none runs once the queue closed, whether it was waiting or already firing."""

from __future__ import annotations

import threading
import time

from dq.storage.timers import Timers


def test_a_call_runs_after_its_delay() -> None:
    lock = threading.RLock()
    timers = Timers(lock)
    called = threading.Event()
    started = time.monotonic()
    timers.call_later(0.05, called.set)
    assert called.wait(10)
    assert time.monotonic() - started >= 0.05


def test_closing_cancels_the_calls_waiting() -> None:
    lock = threading.RLock()
    timers = Timers(lock)
    called = threading.Event()
    timers.call_later(0.2, called.set)
    with lock:
        timers.close()
    assert not called.wait(0.5)


def test_a_call_firing_while_the_queue_closes_does_not_run() -> None:
    """The timer fires while the closing holds the queue's lock: it waits for the lock,
    then sees the queue closed."""
    lock = threading.RLock()
    timers = Timers(lock)
    called = threading.Event()
    with lock:
        timers.call_later(0.0, called.set)
        time.sleep(0.1)  # it has fired and waits for the lock
        timers.close()
    assert not called.wait(0.3)
