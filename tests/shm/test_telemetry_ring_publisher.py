"""Stats snapshots through the telemetry ring: codec, publisher, ``latest``."""

from __future__ import annotations

import mmap
import time
from pathlib import Path

from dq.shm.telemetry import MSG_WORDS, QueueFigures, TelemetryPublisher, decode, encode, latest
from dq.shm.telemetry_ring import OFF_LOCK, TelemetryRing, init_ring, ring_size
from dq.storage import Engine, EngineConfig
from dq.storage.types import NewItem, Release


def test_codec_round_trip() -> None:
    f = QueueFigures(
        7, 1_800_000_000_000, 2, 1, "jobs", 10, 4, 3, 3, 1500, 0, 0, -1, 250, 9, 4096, 2
    )
    raw = encode(f)
    assert len(raw) == MSG_WORDS * 8
    assert decode(raw) == f


def ring(qmax: int = 8) -> mmap.mmap:
    buf = mmap.mmap(-1, ring_size(qmax, MSG_WORDS))
    init_ring(buf, qmax, MSG_WORDS)
    return buf


def test_snapshots_carry_the_engine_figures(tmp_path: Path) -> None:
    with Engine.open(tmp_path, EngineConfig(fsync="always")) as eng:
        buf = ring()
        pub = TelemetryPublisher(eng, buf, interval_s=60)
        eng.enqueue("big", [NewItem(b"x") for _ in range(5)])
        eng.enqueue("small", [NewItem(b"y", delay_ms=60_000)])
        eng.dequeue("big", 2)
        assert pub.snapshot() == 2
        snap = latest(TelemetryRing(buf))
        assert [f.queue for f in snap] == ["big", "small"]  # largest backlog first
        big, small = snap
        assert (big.pending, big.due, big.leased) == (5, 3, 2)
        assert (small.pending, small.delayed, small.lateness_ms) == (1, 1, -1)
        assert big.enqueued_milli > 0 and big.fsyncs > 0 and big.fsync_us > 0
        assert big.released_milli == 0 and small.enqueued_milli > 0
        assert pub.last_cost_ns > 0
        pub.snapshot()
        assert {f.seq for f in latest(TelemetryRing(buf))} == {2}


def test_rates_count_what_happened_since_the_last_snapshot(tmp_path: Path) -> None:
    """Rates are the differences of the queues' running totals between snapshots."""
    with Engine.open(tmp_path, EngineConfig(fsync="never")) as eng:
        pub = TelemetryPublisher(eng, ring(), interval_s=60)
        eng.enqueue("q", [NewItem(b"x") for _ in range(4)])
        pub.snapshot()
        ring_ = TelemetryRing(pub.ring.buf)
        first = latest(ring_)[0]
        assert first.enqueued_milli > 0 and first.released_milli == 0
        pub.snapshot()  # nothing happened since
        idle = latest(ring_)[0]
        assert (idle.enqueued_milli, idle.released_milli, idle.expired_milli) == (0, 0, 0)
        taken = eng.dequeue("q", 3)
        eng.release("q", [Release(d.id, d.receipt) for d in taken])
        time.sleep(0.05)
        pub.snapshot()
        after = latest(ring_)[0]
        assert after.enqueued_milli == 0 and after.released_milli > 0
        # 3 releases in the time since the last snapshot (at least the 50 ms slept)
        assert after.released_milli <= 3 * 1000 * 1000 / 0.05
        eng.delete_queue("q")
        eng.enqueue("q", [NewItem(b"y")])  # made anew: its totals start again
        pub.snapshot()
        assert latest(ring_)[0].enqueued_milli > 0


def test_a_reader_holding_the_header_lock_does_not_stall_snapshots(tmp_path: Path) -> None:
    with Engine.open(tmp_path, EngineConfig(fsync="never")) as eng:
        eng.enqueue("q", [NewItem(b"x")])
        buf = ring()
        pub = TelemetryPublisher(eng, buf)
        reader = TelemetryRing(buf)
        reader.lock(OFF_LOCK, steal=False)  # a live reader that never lets go
        t0 = time.monotonic()
        pub.snapshot()
        assert time.monotonic() - t0 < 1.0
        assert latest(TelemetryRing(buf))[0].queue == "q"


def test_a_full_ring_keeps_the_newest_whole_snapshot(tmp_path: Path) -> None:
    with Engine.open(tmp_path, EngineConfig(fsync="never")) as eng:
        for i in range(3):
            eng.enqueue(f"q{i}", [NewItem(b"x")] * (i + 1))
        buf = ring(4)  # room for one snapshot of 2 queues plus 2 older lines
        pub = TelemetryPublisher(eng, buf)
        assert pub.max_queues == 2
        for _ in range(5):
            pub.snapshot()
        snap = latest(TelemetryRing(buf))
        assert [f.queue for f in snap] == ["q2", "q1"]
        assert {f.seq for f in snap} == {5}
