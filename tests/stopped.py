"""Stopping a process with SIGSTOP the way the tests mean it: stopped once the call returns.

``kill(pid, SIGSTOP)`` returns once the signal is queued; each thread of the process
stops only when it next runs kernel code, and on a busy machine a thread waiting for a
CPU keeps the others running meanwhile: measured here, an etcd member took up to 60 ms
to be wholly stopped at load 6, and in that time it answered a put that the test meant
to send to a stopped member (the put went through, with no quorum left to the test's
eyes). ``sigstop`` waits until every thread of the process is in the stopped state.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

__all__ = ["sigstop"]


def _states(pid: int) -> list[str]:
    """The state letter of each thread of ``pid`` (``T`` stopped), from /proc."""
    states: list[str] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # the process is gone
        return states
    for task in tasks:
        try:
            stat = (task / "stat").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        states.append(stat[stat.rindex(")") + 2])  # after "pid (comm) "
    return states


def sigstop(pid: int, timeout: float = 10.0) -> None:
    """Send SIGSTOP to ``pid`` and return once all its threads are stopped; raise
    AssertionError if they are not within ``timeout`` (or the process is gone)."""
    os.kill(pid, signal.SIGSTOP)
    give_up = time.monotonic() + timeout
    while True:
        states = _states(pid)
        if states and all(s in "Tt" for s in states):
            return
        assert states and "Z" not in states, f"process {pid} is gone"
        assert time.monotonic() < give_up, f"process {pid} not stopped: threads {states}"
        time.sleep(0.001)
