"""The consumer helper under a queue's delivery rules (``docs/delivery.md``): workers
running ``dq.consumer(queue).run(handler)`` side by side, over HTTP and over the ring,
never run two jobs of one group at once with ``group_limit`` 1, and run each group's
jobs in order — though the helper releases a finished job only with its next dequeue.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from dq.client import Client, Item, NewItem, QueueConfig
from tests.server.live import LiveServer, live_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ENV = {"DQ_SHM": "1", "DQ_MAX_WAIT_MS": "5000"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=ENV) as s:
        yield s


def test_workers_run_each_group_one_job_at_a_time_in_order(server: LiveServer) -> None:
    groups = ["customer-1", "customer-2", "customer-3"]
    with Client(server.url) as dq:
        dq.put_queue("events", QueueConfig(group_limit=1))
        # runs of four items of one group: workers ignoring the limit would overlap them
        names = [groups[(n // 4) % 3] for n in range(36)]
        ids = [e.id for e in dq.enqueue_many("events", [NewItem(b"e", group=g) for g in names])]
    group_of = dict(zip(ids, names, strict=True))
    ran: list[tuple[float, float, str, int]] = []
    lock = threading.Lock()
    stop = threading.Event()

    def handler(item: Item) -> None:
        start = time.monotonic()
        time.sleep(0.01)
        with lock:
            ran.append((start, time.monotonic(), group_of[item.id], item.id))
            if len({r[3] for r in ran}) == len(ids):
                stop.set()

    def work(url: str) -> None:
        with Client(url) as c:
            c.consumer("events", wait_ms=200).run(handler, stop=stop)

    urls = [server.url, server.url, f"shm://{server.data_dir}", f"shm://{server.data_dir}"]
    threads = [threading.Thread(target=work, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads)
    assert sorted({r[3] for r in ran}) == ids
    for g in groups:
        mine = sorted((r for r in ran if r[2] == g), key=lambda r: r[0])
        for a, b in itertools.pairwise(mine):
            assert a[1] <= b[0], (g, a, b)  # one at a time
        assert [r[3] for r in mine] == sorted(r[3] for r in mine), g  # in order
