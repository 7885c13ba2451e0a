"""A long-poll answers the same, at the same time, over HTTP and over the ring.

Both transports wait on one ``dq serve`` at once — an HTTP client on one queue, a ring
client (``Client("shm://DIR")``) on its twin — through the same events: the queue
created late, a lease running out mid-wait, a pause lifted, and the server's shutdown.
Each answer's time is measured from its own event (the call that caused it returning,
or the lease's end), never as absolute wall-clock time, and the two transports must
agree within 50 ms. Lease expiry by the server's periodic task is slowed to a minute,
so only the long-poll's own look at the clock can hand over an item whose lease ran
out.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dq.client import Client, Item
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve, over HTTP and its rings

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "60000"}
#: How far apart the two transports' answers to the same event may be.
AGREE_S = 0.050
#: A long-poll longer than any phase: an answer that comes at its end is a failure.
WAIT_MS = 8_000


@dataclass
class Answer:
    items: list[Item]
    at: float  # time.monotonic() when the call returned


class Waiting:
    """One ``dequeue`` long-polling in a thread of its own."""

    def __init__(self, client: Client, queue: str, wait_ms: int = WAIT_MS) -> None:
        self.answer: Answer | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(client, queue, wait_ms))
        self._thread.start()

    def _run(self, client: Client, queue: str, wait_ms: int) -> None:
        try:
            got = client.dequeue(queue, count=5, lease_ms=60_000, wait_ms=wait_ms)
            self.answer = Answer(list(got), time.monotonic())
        except BaseException as exc:
            self.error = exc

    def result(self, timeout: float = WAIT_MS / 1000 + 10) -> Answer:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the long-poll never answered"
        if self.error is not None:
            raise self.error
        assert self.answer is not None
        return self.answer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=ENV) as s:
        yield s


@contextlib.contextmanager
def _clients(server: LiveServer) -> Iterator[tuple[Client, Client, Client]]:
    """(producer, HTTP consumer, ring consumer)."""
    with (
        Client(server.url) as producer,
        Client(server.url) as http,
        Client(f"shm://{server.data_dir}") as ring,
    ):
        yield producer, http, ring


@pytest.fixture
def clients(server: LiveServer) -> Iterator[tuple[Client, Client, Client]]:
    with _clients(server) as three:
        yield three


def _both(
    http: Client, ring: Client, queue: str, event: Callable[[str], float], settle: float = 0.5
) -> tuple[Answer, float, Answer, float]:
    """Start a long-poll of ``queue``-http over HTTP and of ``queue``-ring over the ring,
    then cause ``event`` on each queue (it returns the moment the event happened);
    returns each answer with its event's time."""
    waiting = {"http": Waiting(http, f"{queue}-http"), "ring": Waiting(ring, f"{queue}-ring")}
    time.sleep(settle)  # both are waiting
    at = {name: event(f"{queue}-{name}") for name in ("http", "ring")}
    got = {name: w.result() for name, w in waiting.items()}
    return got["http"], at["http"], got["ring"], at["ring"]


def _same(http: Answer, http_at: float, ring: Answer, ring_at: float, within: float) -> None:
    """Same items, each answered soon after its event, the two within ``AGREE_S``."""
    shape = [[(i.id, i.value, i.stats.dequeue_count) for i in a.items] for a in (http, ring)]
    assert shape[0] == shape[1], shape
    late = (http.at - http_at, ring.at - ring_at)
    assert all(-AGREE_S < t < within for t in late), late
    assert abs(late[0] - late[1]) < AGREE_S, late


def test_a_queue_created_during_the_wait(clients: tuple[Client, Client, Client]) -> None:
    """A worker that starts before its producer gets the first item as it is written."""
    producer, http, ring = clients

    def create(queue: str) -> float:
        producer.enqueue(queue, b"first")
        return time.monotonic()

    _same(*_both(http, ring, "late", create), within=0.5)


def test_a_lease_running_out_during_the_wait(clients: tuple[Client, Client, Client]) -> None:
    """The item comes back to the waiting worker when the lease it was under ends."""
    producer, http, ring = clients
    ends: dict[str, float] = {}
    for name in ("http", "ring"):
        queue = f"expiring-{name}"
        producer.enqueue(queue, b"taken")
        (item,) = producer.dequeue(queue, lease_ms=1_200)
        # the lease's end on this machine's monotonic clock (the server's clock is ms)
        ends[queue] = time.monotonic() + (item.lease_expires - time.time() * 1000) / 1000

    http_answer, _, ring_answer, _ = _both(http, ring, "expiring", lambda q: ends[q], 0.2)
    _same(http_answer, ends["expiring-http"], ring_answer, ends["expiring-ring"], within=0.5)
    assert [i.stats.dequeue_count for i in http_answer.items] == [2]


def test_a_pause_lifted_during_the_wait(clients: tuple[Client, Client, Client]) -> None:
    """A paused queue hands out nothing; the waiting worker gets its item on resume."""
    producer, http, ring = clients
    for name in ("http", "ring"):
        producer.enqueue(f"paused-{name}", b"held")
        producer.pause(f"paused-{name}")

    def resume(queue: str) -> float:
        producer.resume(queue)
        return time.monotonic()

    http_answer, http_at, ring_answer, ring_at = _both(http, ring, "paused", resume, settle=1.0)
    _same(http_answer, http_at, ring_answer, ring_at, within=0.5)
    assert [i.value for i in http_answer.items] == [b"held"]


def test_shutdown_ends_the_wait(tmp_path: Path) -> None:
    """SIGTERM answers every waiting worker at once, empty, over either transport."""
    with live_server(tmp_path / "data", env=ENV) as server, _clients(server) as clients:
        _shutdown(server, *clients)


def _shutdown(server: LiveServer, producer: Client, http: Client, ring: Client) -> None:
    for queue in ("quiet-http", "quiet-ring"):  # both exist, with nothing due
        producer.enqueue(queue, b"x")
        producer.dequeue(queue, lease_ms=60_000)
    waiting = {"http": Waiting(http, "quiet-http"), "ring": Waiting(ring, "quiet-ring")}
    time.sleep(0.5)
    assert server.proc is not None
    server.proc.terminate()
    at = time.monotonic()
    got = {name: w.result() for name, w in waiting.items()}
    assert [got["http"].items, got["ring"].items] == [[], []]
    _same(got["http"], at, got["ring"], at, within=1.0)
