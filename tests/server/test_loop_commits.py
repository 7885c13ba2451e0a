"""Who makes a durable HTTP write durable, counted through the fault seam, not timed.

A lone client's single enqueue is one log write and one fsync, on the event loop's own
thread, even while recent group commits say the disk is slow: with one connection open
nothing else waits behind the loop's fsync, and handing the write to the syncer thread
would only add two thread wake-ups per request (the syncer's, then the loop's for the
answer). Once a second connection is open, a slow disk hands the loop's writes to the
syncer thread again (``storage/syncer.py``: ``InlineCommits.alone``).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.client import Client
from dq.storage import fileio
from dq.storage.syncer import SLOW_COMMIT_S
from tests.server.threaded import ThreadedServer, threaded_server
from tests.tiers import starts_servers


class LogSteps:
    """A fault hook that raises nothing: each step on a log file and its thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def __call__(self, step: str, path: str) -> None:
        if path.endswith(".log"):
            with self._lock:
                self.seen.append((step, threading.current_thread().name))

    def take(self) -> list[tuple[str, str]]:
        with self._lock:
            seen, self.seen = self.seen, []
        return seen


@pytest.fixture
@starts_servers
def server(tmp_path: Path) -> Iterator[ThreadedServer]:
    with threaded_server(tmp_path / "d", fsync="always", shm=False) as srv:
        yield srv


def _slow_disk(server: ThreadedServer) -> None:
    """Make the recent group commits average far over the slow-disk mark (each commit
    brings the average only 5 % of the way back)."""
    syncer = server.engine.syncer
    assert syncer is not None
    syncer.average_commit_s = 1000 * SLOW_COMMIT_S


def _alone(server: ThreadedServer, want: bool) -> None:
    inline = server.app.state.service.inline
    give_up = time.monotonic() + 10
    while inline.alone is not want:
        assert time.monotonic() < give_up, f"the loop's commits never saw alone={want}"
        time.sleep(0.01)


def test_a_lone_clients_durable_enqueue_is_synced_on_the_loop_on_a_slow_disk(
    server: ThreadedServer,
) -> None:
    loop_thread = f"dq-test-{server.port}"
    steps = LogSteps()
    n = 10
    with Client(server.url) as client:
        client.put_queue("q")
        client.enqueue("q", b"warm")
        _alone(server, True)
        syncer = server.engine.syncer
        assert syncer is not None
        handed0 = syncer.counts()[2]
        fileio.FAULTS.append(steps)
        try:
            _slow_disk(server)
            for i in range(n):
                client.enqueue("q", b"one %d" % i)
            alone = steps.take()
            # a second client connects: now a slow fsync on the loop would hold it up
            with socket.create_connection(("127.0.0.1", server.port), timeout=10):
                _alone(server, False)
                _slow_disk(server)
                for i in range(n):
                    client.enqueue("q", b"two %d" % i)
                shared = steps.take()
            _alone(server, True)
            _slow_disk(server)
            client.enqueue("q", b"alone again")
            again = steps.take()
        finally:
            fileio.FAULTS.remove(steps)
    assert server.engine.stats("q").pending == 2 * n + 2

    # one write and one fsync per request, each on the loop's thread: no hand-off
    assert alone == [("write", loop_thread), ("fsync", loop_thread)] * n, alone
    assert syncer.counts()[2] - handed0 == n  # only the second part's writes went over
    assert shared == [("write", "dq-syncer"), ("fsync", "dq-syncer")] * n, shared
    assert again == [("write", loop_thread), ("fsync", loop_thread)], again
