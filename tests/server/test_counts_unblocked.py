"""The first stats call after a restart does not hold up the queue's writes and reads.

Right after a start, the dashboard's history sampler and the queue listing (both in a
worker thread) count a queue's due and delayed items; the first count of a segment file
holding both pending entries and tombstones decodes its blocks to learn how many
tombstones each holds (``storage/segment_counts.py``): seconds at ten million items. That
decoding is held here at a gate, in whichever stats call meets it first, and while it
is held an enqueue and a dequeue of the same queue over HTTP must be answered. (When the
decoding ran under the queue's lock, the enqueue waited for the lock on the event loop,
and nothing was answered until the gate opened.) Once it opens, the counts are exact.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release, segment_counts
from tests.server.threaded import threaded_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]  # an in-process server

QUEUE = "jobs"
HOUR_MS = 3_600_000
#: ~60 of these fill a 64 KiB block: the segment file has ~50 blocks
VALUE = b"x" * 1000
DUE, DELAYED, RELEASED = 1500, 1500, 500

F = TypeVar("F", bound=Callable[..., Any])


class Gate:
    """Holds every call of the functions it wraps until ``open``; ``entered`` is set by
    the first caller."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.opened = threading.Event()

    def hold(self, fn: F) -> F:
        def held(*args: Any) -> Any:
            self.entered.set()
            assert self.opened.wait(60), "the gate was never opened"
            return fn(*args)

        return held  # type: ignore[return-value]


def make_segment_files(data_dir: Path) -> None:
    """A segment file of due items, and one of delayed items with the tombstones of
    released due ones (a freeze cancels a pair within one log, not across two)."""
    engine = Engine.open(data_dir, EngineConfig(fsync="never", auto_merge=False))
    try:
        now = engine.now()
        for deadline, n in ((now - 1000, DUE), (now + HOUR_MS, DELAYED)):
            if deadline > now:
                got = engine.dequeue(QUEUE, RELEASED, lease_ms=60_000)
                engine.release(QUEUE, [Release(d.id, d.receipt) for d in got])
            for lo in range(0, n, 500):
                engine.enqueue(QUEUE, [NewItem(VALUE, deadline=deadline)] * min(500, n - lo))
            engine.freeze(QUEUE)
        give_up = time.monotonic() + 30
        while len(engine.queue(QUEUE).segments) < 2 and time.monotonic() < give_up:
            time.sleep(0.01)  # the last freeze's file is installed after the worker is done
        mixed = engine.queue(QUEUE).segments[-1]
        # what makes a first count decode: both kinds of entry, in many blocks
        assert mixed.info.pending_count == DELAYED and mixed.info.tombstone_count == RELEASED
        assert len(mixed.first_keys) > 20
    finally:
        engine.close()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    held = Gate()
    for name in ("_walk", "_count_tombstones"):  # every block a count decodes
        monkeypatch.setattr(segment_counts, name, held.hold(getattr(segment_counts, name)))
    try:
        yield held
    finally:
        held.opened.set()  # never leave a server thread waiting


def test_an_enqueue_is_answered_while_the_first_count_decodes(tmp_path: Path, gate: Gate) -> None:
    make_segment_files(tmp_path)
    with threaded_server(tmp_path, shm=False, fsync="always") as server:
        listed: list[httpx.Response] = []
        listing = threading.Thread(
            target=lambda: listed.append(httpx.get(f"{server.url}/v1/queues", timeout=90)),
            daemon=True,
        )
        listing.start()  # as the dashboard does; the history sampler may be first
        assert gate.entered.wait(30), "no stats call decoded a block"

        started = time.monotonic()
        with httpx.Client(base_url=server.url, timeout=10) as client:
            put = client.post(f"/v1/queues/{QUEUE}/items", json={"items": [{"value": "new"}]})
            got = client.post(f"/v1/queues/{QUEUE}/dequeue", json={"count": 1})
        assert put.status_code == 200, put.text
        assert got.status_code == 200 and len(got.json()["items"]) == 1, got.text
        # answered while the count was still held at the gate
        assert not gate.opened.is_set() and listing.is_alive()
        assert time.monotonic() - started < 10

        gate.opened.set()
        listing.join(60)
        assert not listing.is_alive()
        (answer,) = listed
        (stats,) = [q["stats"] for q in answer.json()["queues"] if q["name"] == QUEUE]
        counts = (stats["pending"], stats["due"], stats["delayed"], stats["leased"])
        pending = DUE + DELAYED - RELEASED + 1
        assert counts == (pending, DUE - RELEASED, DELAYED, 1)
        again = httpx.get(f"{server.url}/v1/queues/{QUEUE}", timeout=10).json()["stats"]
        assert (again["pending"], again["due"], again["delayed"], again["leased"]) == counts
