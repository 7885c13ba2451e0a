"""A thread that commits its own writes (``Syncer.commit_inline``, the server's event loop).

Its writes wait for its own group commit, not the syncer thread's; one commit answers
every write noted since the last; nothing is answered before it is synced; a failed
sync fails the queue loudly as on the syncer thread; a slow disk hands the writes back
to the syncer thread; closing (the thread's or the engine's) commits what was noted.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig, NewItem, fileio
from dq.storage.errors import EngineUnavailable
from dq.storage.syncer import SLOW_COMMIT_S, FsyncStats, InlineCommits
from tests.storage.faults import AckCheck

pytestmark = pytest.mark.timeout(60)


class CommittingThread:
    """A thread standing in for the event loop: ``run`` runs a function on it at once;
    what is handed to ``call_soon`` waits for the next ``turn``."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._soon: list[Callable[[], None]] = []
        self.scheduled = 0
        self.inline: InlineCommits | None = None

    def call_soon(self, fn: Callable[[], None]) -> None:  # called on the thread
        self.scheduled += 1
        self._soon.append(fn)

    def run(self, fn: Callable[[], Any]) -> Any:
        return self._pool.submit(fn).result(timeout=30)

    def turn(self) -> None:
        """The loop's next turn: run what was handed to ``call_soon``."""

        def run_soon() -> None:
            soon, self._soon = self._soon, []
            for fn in soon:
                fn()

        self.run(run_soon)

    def stop(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always", compaction="inline")) as e:
        e.ensure_queue("q")
        yield e


@pytest.fixture
def loop() -> Iterator[CommittingThread]:
    t = CommittingThread()
    yield t
    t.stop()


def _inline(engine: Engine, loop: CommittingThread) -> InlineCommits:
    assert engine.syncer is not None
    inline: InlineCommits = loop.run(lambda: engine.syncer.commit_inline(loop.call_soon))
    loop.inline = inline
    return inline


@contextmanager
def fault(hook: Callable[[str, str], None]) -> Iterator[None]:
    fileio.FAULTS.append(hook)
    try:
        yield
    finally:
        fileio.FAULTS.remove(hook)


def _enqueue(engine: Engine, loop: CommittingThread, value: bytes) -> Future[Any]:
    """An enqueue started on the committing thread, as the server's hot path starts one."""

    def start() -> Future[Any]:
        assert loop.inline is not None
        return engine.enqueue_nowait("q", [NewItem(value)], inline=loop.inline)

    fut: Future[Any] = loop.run(start)
    return fut


def test_writes_wait_for_the_threads_own_commit_and_one_commit_answers_all(
    tmp_path: Path, loop: CommittingThread
) -> None:
    data = tmp_path / "d"
    with (
        fileio.simulate_power_loss(str(data)) as power,
        AckCheck(power) as acks,
        Engine.open(data, EngineConfig(fsync="always", compaction="inline")) as engine,
    ):
        engine.ensure_queue("q")
        inline = _inline(engine, loop)
        futs = [_enqueue(engine, loop, b"v%d" % i) for i in range(3)]
        assert loop.scheduled == 1, "one commit scheduled for the whole round"
        time.sleep(0.2)  # the syncer thread must not take them
        assert not any(f.done() for f in futs)
        assert engine.dequeue("q", 10, 60_000) == []  # nothing published before the sync
        loop.turn()
        assert all(f.done() for f in futs)
        assert acks.checked == 3 and acks.violations == []
        values = sorted(d.value for d in engine.dequeue("q", 10, 60_000))
        assert values == [b"v0", b"v1", b"v2"]
        assert inline.commits == 1
        later = _enqueue(engine, loop, b"next round")
        assert loop.scheduled == 2
        loop.turn()
        assert later.result(timeout=10)


def test_other_threads_still_use_the_syncer_thread(engine: Engine, loop: CommittingThread) -> None:
    inline = _inline(engine, loop)
    assert engine.enqueue_nowait("q", [NewItem(b"x")]).result(timeout=10)  # no turn needed
    # handed the committing thread's commits by mistake: still the syncer thread's
    assert engine.enqueue_nowait("q", [NewItem(b"y")], inline=inline).result(timeout=10)
    assert loop.scheduled == 0


def test_a_write_the_thread_waits_for_goes_to_the_syncer_thread(
    engine: Engine, loop: CommittingThread
) -> None:
    """Only writes started with the thread's own commits (``inline=``) wait for them: a
    blocking call on that thread must not wait for a commit it would run."""
    _inline(engine, loop)
    started = time.monotonic()
    assert loop.run(lambda: engine.enqueue("q", [NewItem(b"blocking")], timeout=5))
    assert time.monotonic() - started < 4
    assert loop.scheduled == 0


def test_a_failed_sync_on_the_committing_thread_fails_the_queue_loudly(
    engine: Engine, loop: CommittingThread
) -> None:
    _inline(engine, loop)
    fut = _enqueue(engine, loop, b"lost")

    def eio(step: str, path: str) -> None:
        if step == "fsync" and path.endswith(".log"):
            raise OSError(errno.EIO, "Input/output error (injected)", path)

    with fault(eio):
        loop.turn()
    with pytest.raises(EngineUnavailable):
        fut.result(timeout=10)
    assert engine.stats("q").extra["io_errors"] == 1


def test_a_slow_disk_hands_the_writes_back_to_the_syncer_thread(
    engine: Engine, loop: CommittingThread
) -> None:
    inline = _inline(engine, loop)

    def slow(step: str, path: str) -> None:
        if step == "fsync" and path.endswith(".log"):
            time.sleep(SLOW_COMMIT_S * 3)

    with fault(slow):
        deadline = time.monotonic() + 30
        while True:  # inline commits until the average says the disk is slow
            fut = _enqueue(engine, loop, b"x")
            if inline.handed_back:
                break
            loop.turn()
            fut.result(timeout=10)
            assert time.monotonic() < deadline, "a slow disk never handed the writes back"
        assert fut.result(timeout=10)  # answered by the syncer thread: no turn
    # a fast disk again: the syncer thread's commits bring the average down
    deadline = time.monotonic() + 30
    while True:
        fut = _enqueue(engine, loop, b"y")
        if not fut.done():
            break  # noted for the committing thread again
        assert time.monotonic() < deadline, "the committing thread never took writes again"
        fut.result(timeout=10)
    loop.turn()
    assert fut.result(timeout=10)


def test_closing_commits_what_was_noted(engine: Engine, loop: CommittingThread) -> None:
    inline = _inline(engine, loop)
    fut = _enqueue(engine, loop, b"noted")
    inline.close()  # from another thread, as a server shutting down
    assert fut.result(timeout=10)
    later = _enqueue(engine, loop, b"after")  # the thread writes through the syncer now
    assert later.result(timeout=10)


@pytest.mark.integration
def test_closing_the_engine_commits_what_was_noted(tmp_path: Path) -> None:
    loop = CommittingThread()
    try:
        e = Engine.open(tmp_path / "d", EngineConfig(fsync="always", compaction="inline"))
        e.ensure_queue("q")
        _inline(e, loop)
        fut = _enqueue(e, loop, b"kept")
        e.close()
        assert fut.result(timeout=10)
    finally:
        loop.stop()
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always")) as again:
        assert [d.value for d in again.dequeue("q", 10, 60_000)] == [b"kept"]


def test_inline_commits_need_fsync_always(tmp_path: Path) -> None:
    cfg = EngineConfig(fsync="interval", fsync_interval_ms=50, compaction="inline")
    with Engine.open(tmp_path / "d", cfg) as e:
        assert e.syncer is not None
        with pytest.raises(RuntimeError, match="fsync=always"):
            e.syncer.commit_inline(lambda fn: None)


def test_the_fsync_histogram_counts_each_sync_in_the_first_bucket_it_fits() -> None:
    """``FsyncStats``: a latency on a bucket's bound is counted in that bucket (``le``,
    as Prometheus reads it), one past the last bound in the +Inf bucket."""
    stats = FsyncStats()
    for seconds in (0.0, 0.0005, 0.00051, 0.001, 0.3, 1.0, 7.0):
        stats.observe(seconds)
    count, total, buckets = stats.snapshot()
    assert count == 7 and total == pytest.approx(8.30201)
    assert dict(buckets) == {
        0.0005: 2,
        0.001: 4,
        0.002: 4,
        0.005: 4,
        0.01: 4,
        0.025: 4,
        0.05: 4,
        0.1: 4,
        0.25: 4,
        1.0: 6,
        float("inf"): 7,
    }
