"""Group commit: one thread makes every queue's log durable for all writers at once.

In ``always`` mode a write is framed into its queue's log buffer and its future is
parked; this thread takes each dirty buffer, writes it with one ``write`` and syncs
it with one ``fdatasync``, then publishes every batch that sync covered and resolves
their futures. Writers that arrive while a sync is in flight ride on the next one, so
under load one fsync serves many requests. In ``interval`` mode the thread only
syncs dirty logs every ``interval_ms``; acknowledgements do not wait for it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

__all__ = ["FsyncStats", "SyncTarget", "Syncer"]

log = logging.getLogger(__name__)


class SyncTarget(Protocol):
    def sync_round(self) -> None: ...


class FsyncStats:
    """Counts and a fixed-bucket histogram of fsync latency (seconds), for /metrics."""

    BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.total_seconds = 0.0
        self.bucket_counts = [0] * (len(self.BOUNDS) + 1)

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.total_seconds += seconds
            for i, bound in enumerate(self.BOUNDS):
                if seconds <= bound:
                    self.bucket_counts[i] += 1
                    break
            else:
                self.bucket_counts[-1] += 1

    def snapshot(self) -> tuple[int, float, list[tuple[float, int]]]:
        """(count, sum, cumulative buckets as (upper bound, count)), Prometheus style."""
        with self._lock:
            acc, buckets = 0, []
            for bound, n in zip((*self.BOUNDS, float("inf")), self.bucket_counts, strict=True):
                acc += n
                buckets.append((bound, acc))
            return self.count, self.total_seconds, buckets


class Syncer:
    def __init__(self, mode: str, interval_ms: int) -> None:
        self.mode = mode
        self.interval = interval_ms / 1000.0
        self._cond = threading.Condition()
        self._dirty: dict[SyncTarget, None] = {}
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="dq-syncer", daemon=True)
        self._thread.start()

    def mark_dirty(self, target: SyncTarget) -> None:
        with self._cond:
            if target not in self._dirty:
                self._dirty[target] = None
                if self.mode == "always":
                    self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                if self.mode == "always":
                    while not self._dirty and not self._stopping:
                        self._cond.wait()
                else:
                    self._cond.wait_for(lambda: self._stopping, timeout=self.interval)
                batch = list(self._dirty)
                self._dirty.clear()
                stopping = self._stopping
            for target in batch:
                try:
                    target.sync_round()
                except Exception:  # the target has failed its waiters; keep serving others
                    log.exception("sync round failed")
            if stopping:
                with self._cond:
                    if not self._dirty:
                        return

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + 30
        self._thread.join(timeout=max(deadline - time.monotonic(), 0))
