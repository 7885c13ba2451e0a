"""Merging: the design's rogue-tombstone example, crash at every step of a merge, the policy."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release, compactor, fileio
from tests.storage.conftest import FakeClock


def drain(engine: Engine, queue: str) -> dict[int, bytes]:
    out: dict[int, bytes] = {}
    for _ in range(1000):
        got = engine.dequeue(queue, 1000, 60_000)
        if not got:
            return out
        out.update((d.id, d.value) for d in got)
    raise AssertionError("queue never drained")


def test_original_example_rogue_tombstone_is_kept(
    open_engine: Callable[..., Engine], tmp_path: Path
) -> None:
    """The storage design's example (docs/merging.md): A holds "a", B its tombstone;
    merging B and C keeps the rogue tombstone."""
    e = open_engine()
    [a] = e.enqueue("q", [NewItem(b"a")])
    e.freeze("q")  # segment A
    [d] = e.dequeue("q")
    assert d.id == a.id
    e.release("q", [Release(d.id, d.receipt)])
    e.enqueue("q", [NewItem(b"b")])
    e.freeze("q")  # segment B: tombstone for "a" (+ "b")
    e.enqueue("q", [NewItem(b"c")])
    e.freeze("q")  # segment C
    q = e.queue("q")
    assert len(q.segments) == 3
    q.merge(1, 3)  # B and C: not a prefix
    assert len(q.segments) == 2
    merged = q.segments[1]
    assert merged.info.tombstone_count == 1, "the rogue tombstone must survive this merge"
    e.close()

    e = open_engine()  # cursor starts from the beginning again
    assert sorted(drain(e, "q").values()) == [b"b", b"c"]  # "a" is never delivered
    e.close()

    e = open_engine()
    q = e.queue("q")
    q.merge(0, 2)  # a prefix merge: "a" and its tombstone meet and cancel
    [only] = q.segments
    assert only.info.tombstone_count == 0 and only.info.pending_count == 2
    assert sorted(drain(e, "q").values()) == [b"b", b"c"]


class Crash(Exception):
    """Raised by the fault hook: the process 'dies' before this step runs."""


def abandon(engine: Engine) -> None:
    """Drop an engine the way a killed process would: no flush, no cleanup."""
    for q in engine._queues.values():
        q.health.closed = True
        os.close(q.commit.wal._fd)
        for r in q.segments:
            r.close()
    engine._stop_maintenance.set()
    if engine.syncer is not None:
        engine.syncer.stop()
    os.close(engine._lock_fd)


def build_template(path: Path, clock: FakeClock) -> tuple[set[bytes], set[bytes]]:
    """Four segments: live items, released items, tombstones in later segments."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    e = Engine.open(path, cfg, clock=clock)
    live: set[bytes] = set()
    released: set[bytes] = set()
    for seg in range(4):
        values = [f"s{seg}-{i}".encode() * 10 for i in range(40)]
        e.enqueue("q", [NewItem(v) for v in values])
        got = e.dequeue("q", 25, 60_000)
        e.release("q", [Release(d.id, d.receipt) for d in got])
        released |= {d.value for d in got}
        e.freeze("q")
    live = {
        v for seg in range(4) for v in (f"s{seg}-{i}".encode() * 10 for i in range(40))
    } - released
    e.close()
    return live, released


@pytest.mark.parametrize("start,stop", [(0, 4), (1, 3), (0, 2), (2, 4)])
def test_crash_at_every_step_of_a_merge(
    tmp_path: Path, clock: FakeClock, start: int, stop: int
) -> None:
    template = tmp_path / "template"
    live, released = build_template(template, clock)
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)

    # count the steps of a clean merge
    steps: list[tuple[str, str]] = []
    probe = tmp_path / "probe"
    shutil.copytree(template, probe)
    e = Engine.open(probe, cfg, clock=clock)
    fileio.FAULTS.append(lambda step, path: steps.append((step, path)))
    try:
        e.queue("q").merge(start, stop)
    finally:
        fileio.FAULTS.clear()
    e.close()
    assert any(s == "rename" for s, _ in steps) and any(s == "unlink" for s, _ in steps)

    for n in range(len(steps) + 1):
        work = tmp_path / f"crash-{n}"
        shutil.copytree(template, work)
        e = Engine.open(work, cfg, clock=clock)
        seen = 0

        def hook(step: str, path: str, n: int = n) -> None:
            nonlocal seen
            seen += 1
            if seen == n + 1:
                raise Crash(f"before step {n}: {step} {path}")

        fileio.FAULTS.append(hook)
        try:
            try:
                e.queue("q").merge(start, stop)
            except Crash:
                pass
        finally:
            fileio.FAULTS.clear()
            abandon(e)
        # reopen: nothing acknowledged is lost, nothing released comes back
        e = Engine.open(work, cfg, clock=clock)
        try:
            got = set(drain(e, "q").values())
            assert got == live, f"crash before step {n} ({steps[n] if n < len(steps) else 'end'})"
            assert not got & released
            assert not list(work.glob("queues/q/*.tmp"))
        finally:
            e.close()
        shutil.rmtree(work)


def test_policy_gives_disk_space_back(tmp_path: Path) -> None:
    cfg = EngineConfig(
        fsync="never", compaction="thread", memseg_bytes=64 * 1024, idle_freeze_seconds=0.2
    )
    with Engine.open(tmp_path / "d", cfg) as e:
        for _ in range(40):  # random values: zstd cannot shrink them
            e.enqueue("q", [NewItem(os.urandom(200)) for _ in range(50)])
        full = e.stats("q").bytes_on_disk
        assert full > 300_000
        while got := e.dequeue("q", 500, 60_000):
            e.release("q", [Release(d.id, d.receipt) for d in got])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            s = e.stats("q")
            if s.segments == 0 and s.bytes_on_disk < 1024:
                break
            time.sleep(0.1)
        s = e.stats("q")
        assert s.segments == 0 and s.bytes_on_disk < 1024, s
        assert s.pending == 0


def test_count_trigger_merges_small_neighbours(tmp_path: Path) -> None:
    from dq.storage.merge_policy import MergePolicy

    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    with Engine.open(tmp_path / "d", cfg) as e:
        for i in range(6):
            e.enqueue("q", [NewItem(bytes([i]) * (100 if i != 3 else 10))])
            e.freeze("q")
        q = e.queue("q")
        policy = MergePolicy(max_segments=4, fan_in=2)
        start, stop = policy.plan(q) or (0, 0)
        assert stop - start == 2
        q.merge(start, stop)
        assert len(q.segments) == 5
        assert sorted(drain(e, "q").values()) == sorted(
            bytes([i]) * (100 if i != 3 else 10) for i in range(6)
        )


def test_closing_during_a_merge_stops_it_quietly(
    open_engine: Callable[..., Engine],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A merge the closing queue cancels is no failure: nothing logged as an error, no
    ``merge_error`` for operators, and every item is there when the queue opens again."""
    e = open_engine(compaction="thread")
    for batch in range(3):
        e.enqueue("q", [NewItem(b"%d-%d" % (batch, i)) for i in range(10)])
        e.freeze("q")
    started, go_on = threading.Event(), threading.Event()
    real = compactor.net_entries_grouped

    def held(*args: object, **kwargs: object) -> object:
        started.set()
        assert go_on.wait(20)  # until close has asked the merge to stop
        yield from real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(compactor, "net_entries_grouped", held)
    q = e.queue("q")
    q.merge(0, 3, wait=False)
    assert started.wait(20)
    closing = threading.Thread(target=e.close)
    with caplog.at_level(logging.INFO, logger="dq.storage"):
        closing.start()
        marker = Path(q.directory) / "merge.cancel"
        give_up = time.monotonic() + 20
        while not marker.exists():
            assert time.monotonic() < give_up, "close never asked the merge to stop"
            time.sleep(0.01)
        go_on.set()
        closing.join(30)
    assert not closing.is_alive()
    assert [r.message for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("merge stopped" in r.message for r in caplog.records)
    assert q.files.merge_error is None
    e = open_engine(path=tmp_path / "data")
    assert len(e.queue("q").segments) == 3
    assert len(drain(e, "q")) == 30
