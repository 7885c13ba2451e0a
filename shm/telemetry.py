"""Stats snapshots on the telemetry ring: the message codec and the server's publisher.

Owns the snapshot message of docs/shm.md ("Telemetry ring", dq's messages) and
the publisher thread that writes one snapshot per interval: one message per queue (the
largest backlogs first, at most half the ring so the newest snapshot is always whole),
with rates from the differences of the queues' running totals (``Engine.totals``) and
fsync latency from the engine's fsync histogram.

Invariant kept: the publisher's cost per snapshot is a few lock/copy steps per queue and
never waits on a reader longer than the ring's ``steal_after_s`` per lock.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from dataclasses import dataclass, fields
from typing import Any

from dq.shm.telemetry_ring import TelemetryRing

__all__ = ["MSG_WORDS", "QueueFigures", "TelemetryPublisher", "decode", "encode", "latest"]

log = logging.getLogger(__name__)

MSG = struct.Struct("<QQII128s7Qq5Q")
MSG_WORDS = 32
assert MSG.size == MSG_WORDS * 8


@dataclass(frozen=True, slots=True)
class QueueFigures:
    """One queue's line of one snapshot. Rates are per second x 1000."""

    seq: int
    time: int
    count: int
    index: int
    queue: str
    pending: int
    due: int
    leased: int
    delayed: int
    enqueued_milli: int
    released_milli: int
    expired_milli: int
    lateness_ms: int
    fsync_us: int
    fsyncs: int
    bytes_on_disk: int
    segments: int
    reserved: int = 0


_NAMES = tuple(field.name for field in fields(QueueFigures))


def encode(f: QueueFigures) -> bytes:
    values = [getattr(f, name) for name in _NAMES]  # not astuple: it deep-copies (slow)
    values[4] = f.queue.encode("ascii")
    return MSG.pack(*values)


def decode(raw: bytes) -> QueueFigures:
    values = list(MSG.unpack_from(raw))
    values[4] = values[4].rstrip(b"\0").decode("ascii", "replace")
    return QueueFigures(*values)


def latest(ring: TelemetryRing) -> list[QueueFigures]:
    """The newest complete snapshot in the ring (the newest partial one if none is)."""
    figures = [decode(m) for m in ring.peek()]
    by_seq: dict[int, list[QueueFigures]] = {}
    for f in figures:
        by_seq.setdefault(f.seq, []).append(f)
    for seq in sorted(by_seq, reverse=True):
        lines = by_seq[seq]
        if len({f.index for f in lines}) == lines[0].count:
            return sorted(lines, key=lambda f: f.index)
    return sorted(by_seq[max(by_seq)], key=lambda f: f.index) if by_seq else []


class TelemetryPublisher:
    """Writes a snapshot every ``interval_s`` from its own thread."""

    def __init__(self, engine: Any, buf: Any, *, interval_s: float = 1.0) -> None:
        self.engine = engine
        self.ring = TelemetryRing(buf)
        self.interval_s = interval_s
        self.max_queues = max(1, self.ring.queue_max_len // 2)
        self.seq = 0
        self.last_cost_ns = 0
        #: each queue's ``Engine.totals`` at the last snapshot
        self._last_totals: dict[str, tuple[int, int, int]] = {}
        self._last_fsync = (0, 0.0)
        self._last_time = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dq-telemetry", daemon=True)

    def start(self) -> TelemetryPublisher:
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.snapshot()
            except Exception:
                log.exception("telemetry snapshot failed")

    def snapshot(self) -> int:
        """Write one snapshot now; returns the number of queue messages written."""
        t0 = time.perf_counter_ns()
        engine, now_s = self.engine, time.monotonic()
        elapsed = max(now_s - self._last_time, 1e-6)
        self._last_time = now_s
        fsync_us, fsyncs = self._fsync()
        stats = []
        totals: dict[str, tuple[int, int, int]] = {}
        for name in engine.list_queues():
            try:
                stats.append(engine.stats(name))
                totals[name] = engine.totals(name)
            except Exception:  # deleted meanwhile
                continue
        last, self._last_totals = self._last_totals, totals
        stats.sort(key=lambda s: -s.pending)
        stats = stats[: self.max_queues]
        self.seq += 1
        now = engine.now()

        def rates(queue: str) -> list[int]:
            """Per second x 1000 since the last snapshot. A total below its last value
            started again (the queue was deleted and made anew): it counts from zero."""
            before = last.get(queue, (0, 0, 0))
            return [
                int((n - b if n >= b else n) * 1000 / elapsed)
                for n, b in zip(totals[queue], before, strict=True)
            ]

        for i, s in enumerate(stats):
            age = s.oldest_due_age_ms
            enqueued, released, expired = rates(s.name)
            figures = QueueFigures(
                self.seq, now, len(stats), i, s.name, s.pending, s.due, s.leased, s.delayed,
                enqueued, released, expired, -1 if age is None else age, fsync_us, fsyncs,
                s.bytes_on_disk, s.segments,
            )  # fmt: skip
            self.ring.enqueue(encode(figures))
        self.last_cost_ns = time.perf_counter_ns() - t0
        return len(stats)

    def _fsync(self) -> tuple[int, int]:
        """(mean fsync latency in µs since the last snapshot, fsyncs so far)."""
        stats = getattr(self.engine, "fsync_stats", None)
        if stats is None:
            return 0, 0
        count, total, _ = stats.snapshot()
        last_count, last_total = self._last_fsync
        self._last_fsync = (count, total)
        n = count - last_count
        return (int((total - last_total) / n * 1e6) if n > 0 else 0), count
