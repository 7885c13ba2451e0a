"""SIGKILL the server under concurrent load, restart it, and check what was acknowledged.

Every enqueue the server acknowledged must be there after the restart, with its value;
every release it acknowledged must stay released. Work that was only leased comes
back (at-least-once).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dq.client import Client, ClientError, Release
from tests.server.live import LiveServer

# integration: live dq serve processes, SIGKILLed
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

QUEUE = "crash"


def _producer(url: str, tag: int, acked: dict[int, bytes], stop: threading.Event) -> None:
    n = 0
    with Client(url, retries=0, timeout=10) as dq:
        while not stop.is_set():
            values = [f"p{tag}-{n + i}".encode() for i in range(10)]
            try:
                done = dq.enqueue_many(QUEUE, values)
            except ClientError:
                return
            for e, v in zip(done, values, strict=True):
                acked[e.id] = v
            n += 10


def _consumer(url: str, released: set[int], unsure: set[int], stop: threading.Event) -> None:
    with Client(url, retries=0, timeout=10) as dq:
        while not stop.is_set():
            try:
                items = dq.dequeue(QUEUE, count=20, lease_ms=60_000, wait_ms=100)
            except ClientError:
                return
            if not items:
                continue
            try:
                outcomes = dq.release_many(QUEUE, [Release(i.id, i.receipt) for i in items])
            except ClientError:  # the server died: these releases may or may not be done
                unsure.update(i.id for i in items)
                return
            released.update(o.id for o in outcomes if o.ok)


def test_acknowledged_work_survives_sigkill(tmp_path: Path) -> None:
    data = tmp_path / "data"
    server = LiveServer(data, fsync="always").start()
    acked: dict[int, bytes] = {}
    released: set[int] = set()
    unsure: set[int] = set()
    stop = threading.Event()
    try:
        with Client(server.url) as dq:
            dq.put_queue(QUEUE)
        threads = [
            threading.Thread(target=_producer, args=(server.url, t, acked, stop)) for t in range(4)
        ] + [
            threading.Thread(target=_consumer, args=(server.url, released, unsure, stop))
            for _ in range(2)
        ]
        for t in threads:
            t.start()
        give_up = time.monotonic() + 30
        while (len(acked) < 500 or len(released) < 100) and time.monotonic() < give_up:
            time.sleep(0.05)
        server.kill()  # SIGKILL mid-load
        stop.set()
        for t in threads:
            t.join(30)
            assert not t.is_alive()
    finally:
        stop.set()
        server.kill()
    assert len(acked) >= 500 and released, "the load did not get going"

    again = LiveServer(data, fsync="always").start()
    try:
        present: dict[int, bytes] = {}
        with Client(again.url) as dq:
            while True:
                items = dq.dequeue(QUEUE, count=1000, lease_ms=600_000)
                if not items:
                    break
                present.update((i.id, i.value) for i in items)
    finally:
        again.terminate()
    assert released.isdisjoint(present), "a released item came back"
    assert released <= acked.keys()
    missing = [i for i in acked if i not in released | unsure and i not in present]
    assert not missing, f"{len(missing)} acknowledged enqueues lost, e.g. {missing[:5]}"
    assert all(present[i] == v for i, v in acked.items() if i in present)
