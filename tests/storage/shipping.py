"""The leader's side of replication under test, in one process: a sink that keeps every
frame the engine ships (the test plays the followers), and a follower that commits each
frame at once. Used by tests/storage/test_replication.py, test_replication_review.py and
test_schedules_replica.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from dq.storage import Engine
from dq.storage.replication import Frame

__all__ = ["AutoCommit", "ListSink", "leading"]


class ListSink:
    """A replicator that keeps every shipped frame in a list (the tests play the followers)."""

    def __init__(self, commit_timeout_s: float = 10.0) -> None:
        self.commit_timeout_s = commit_timeout_s
        self.admitting = True
        self.frames: list[Frame] = []
        self.failures: list[str] = []
        self._lock = threading.Lock()

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        with self._lock:
            lsn = len(self.frames) + 1
            self.frames.append(Frame(lsn, queue, kind, payload))
            return lsn

    def admits_writes(self) -> bool:
        return self.admitting

    def local_failure(self, queue: str, error: BaseException) -> None:
        self.failures.append(queue)

    @property
    def last(self) -> int:
        return len(self.frames)


class AutoCommit:
    """Commits every shipped frame at once from a thread (a follower that always acks)."""

    def __init__(self, engine: Engine, sink: ListSink) -> None:
        self.engine, self.sink = engine, sink
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.002):
            self.engine.commit(self.sink.last)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)

    def __enter__(self) -> AutoCommit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def leading(
    engines: Callable[..., Engine], name: str = "leader", **overrides: object
) -> tuple[Engine, ListSink]:
    """An engine of ``engines`` (``tests/storage/conftest.py``) leading a replica group:
    it ships every record to the sink returned with it."""
    leader = engines(name, **overrides)
    sink = ListSink()
    leader.set_replication(sink)
    return leader, sink
