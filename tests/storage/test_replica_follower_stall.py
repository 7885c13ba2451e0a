"""A follower whose writes are stalled waits before it appends the leader's next record
(``ReplicaEngine.apply``, ``FileJobs.refuse_if_stalled``), as a leader's write does: its
logs stay within twice ``memseg_bytes`` plus one record while its compaction worker
hangs, every record is applied once the worker goes on, and a caller that stops
following cuts the wait short. Driven through the engine as the follower's pull loop
drives it; the freeze is held on a gate, as a hung worker holds it."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, NewItem, file_jobs
from dq.storage.errors import WriteStall
from dq.storage.replication import Frame
from dq.storage.wal import read_wal
from tests.storage.shipping import AutoCommit, leading

MEMSEG = 4096
VALUE = 500
#: twice the limit, plus the one record that crossed it (one item of VALUE bytes)
LOG_BOUND = 2 * MEMSEG + VALUE + 256
ITEMS = 60  # ~15 logs' worth


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Freezes wait until the gate opens (opened at the end whatever happens)."""
    opened = threading.Event()
    real = file_jobs.freeze_log

    def held(*args: Any, **kwargs: Any) -> Any:
        assert opened.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(file_jobs, "freeze_log", held)
    yield opened
    opened.set()


def shipped(engines: Callable[..., Engine]) -> list[Frame]:
    """The frames of ITEMS enqueues of one item each on a leader."""
    leader, sink = leading(engines)
    with AutoCommit(leader, sink):
        for _ in range(ITEMS):
            leader.enqueue("q", [NewItem(os.urandom(VALUE))])
    return sink.frames


def stalling_follower(engines: Callable[..., Engine], **overrides: object) -> Engine:
    follower = engines(
        "follower", memseg_bytes=MEMSEG, max_frozen=1, compaction="thread", **overrides
    )
    follower.set_role(False, "http://leader:1")
    return follower


def logs(engine: Engine) -> dict[str, int]:
    """Valid bytes of each log of queue q (open or closed), as ``dq inspect`` reads them."""
    folder = Path(engine.root) / "queues" / "q"
    if not folder.is_dir():
        return {"none yet": 0}
    return {
        p.name: read_wal(str(p)).valid_end
        for p in folder.iterdir()
        if p.suffix in (".log", ".log_ro")
    }


class Applying:
    """``follower.apply(frames, stopping)`` in a thread, as the pull loop calls it (the
    loop passes ``stopping``: it waits as long as the stall lasts)."""

    def __init__(
        self, follower: Engine, frames: list[Frame], stopping: Callable[[], bool] | None
    ) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(follower, frames, stopping))
        self.thread.start()

    def _run(
        self, follower: Engine, frames: list[Frame], stopping: Callable[[], bool] | None
    ) -> None:
        try:
            follower.apply(frames, stopping).result(30)
        except BaseException as exc:
            self.error = exc

    def stalled(self, follower: Engine) -> bool:
        """It waits before a record, with a frozen log waiting for its segment file."""
        if not follower.has_queue("q"):
            return False
        return self.thread.is_alive() and follower.stats("q").extra["frozen"] == 1


def wait_until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        if time.monotonic() > give_up:
            raise AssertionError(f"not within {timeout} s: {check}")
        time.sleep(0.01)


def test_a_stalled_follower_waits_bounded_and_applies_everything_once_the_worker_goes_on(
    engines: Callable[..., Engine], gate: threading.Event
) -> None:
    frames = shipped(engines)
    follower = stalling_follower(engines)
    applying = Applying(follower, frames, lambda: False)
    wait_until(lambda: applying.stalled(follower) and max(logs(follower).values()) > MEMSEG)
    time.sleep(0.3)  # it stays put: nothing more is appended while stalled
    held = logs(follower)
    assert applying.thread.is_alive()
    assert max(held.values()) <= LOG_BOUND, held
    assert follower.stats("q").pending < ITEMS
    gate.set()
    applying.thread.join(30)
    assert not applying.thread.is_alive() and applying.error is None, applying.error
    assert follower.stats("q").pending == ITEMS
    assert max(logs(follower).values()) <= LOG_BOUND


def test_a_stalled_apply_ends_when_the_caller_stops_following(
    engines: Callable[..., Engine], gate: threading.Event
) -> None:
    frames = shipped(engines)
    follower = stalling_follower(engines)
    stop = threading.Event()
    applying = Applying(follower, frames, stop.is_set)
    wait_until(lambda: applying.stalled(follower) and max(logs(follower).values()) > MEMSEG)
    stop.set()
    applying.thread.join(2)
    assert not applying.thread.is_alive()
    assert isinstance(applying.error, WriteStall)


def test_without_a_stop_to_ask_one_record_waits_at_most_the_engines_wait_timeout(
    engines: Callable[..., Engine], gate: threading.Event
) -> None:
    frames = shipped(engines)
    follower = stalling_follower(engines, wait_timeout_s=0.5)
    applying = Applying(follower, frames, None)
    applying.thread.join(10)
    assert not applying.thread.is_alive()
    assert isinstance(applying.error, WriteStall)
    held = logs(follower)
    assert max(held.values()) <= LOG_BOUND, held
