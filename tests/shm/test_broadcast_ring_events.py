"""Engine events through the broadcast ring: codec, publisher, ``dq.shm.subscriber``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.shm import subscriber
from dq.shm.errors import ProtocolError
from dq.shm.events import MAX_IDS, decode, encode
from dq.shm.rings_host import RingsHost
from dq.storage import Engine, EngineConfig
from dq.storage.events import Event
from dq.storage.types import NewItem, Release


def test_codec_round_trip_and_chunks() -> None:
    event = Event("released", "q.1", tuple(range(2500)), 1_800_000_000_000)
    msgs = encode(event)
    assert len(msgs) == 3
    back = [decode(m) for m in msgs]
    assert sum((e.ids for e in back), ()) == event.ids
    assert {(e.kind, e.queue, e.time) for e in back} == {("released", "q.1", event.time)}
    assert len(back[0].ids) == MAX_IDS
    assert decode(encode(Event("queue_deleted", "q", (), 5))[0]) == Event(
        "queue_deleted", "q", (), 5
    )


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\x01\x01",
        b"\x63\x01\x00\x00" + bytes(8) + b"q",
        b"\x01\x05\x00\x00" + bytes(8) + b"q",
    ],
)
def test_malformed_messages_are_protocol_errors(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode(raw)


@pytest.fixture
def host(tmp_path: Path) -> Iterator[tuple[Engine, Path]]:
    eng = Engine.open(tmp_path, EngineConfig(fsync="never"))
    rings = RingsHost(eng, tmp_path, telemetry_interval_s=0.2).start()
    yield eng, tmp_path
    rings.close()
    eng.close()


def collect(sub: subscriber.Subscription, n: int, timeout_s: float = 10) -> list[Event]:
    got: list[Event] = []
    give_up = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < give_up:
        got.extend(sub.poll(0.2))
    return got


def test_subscribers_see_every_kind_in_order(host: tuple[Engine, Path]) -> None:
    eng, data = host
    with subscriber.subscribe(data, "jobs") as jobs, subscriber.subscribe(data) as everything:
        [first] = eng.enqueue("jobs", [NewItem(b"a")])
        eng.enqueue("other", [NewItem(b"b")])
        [d] = eng.dequeue("jobs", 1, lease_ms=1)
        time.sleep(0.01)
        eng.expire_leases("jobs")
        [d] = eng.dequeue("jobs", 1)
        eng.release("jobs", [Release(d.id, d.receipt)])
        eng.delete_queue("jobs")
        kinds = [(e.kind, e.ids) for e in collect(jobs, 6) if e.kind != "due"]
        assert kinds == [
            ("queue_created", ()),
            ("enqueued", (first.id,)),
            ("lease_expired", (first.id,)),
            ("released", (first.id,)),
            ("queue_deleted", ()),
        ]
        assert {e.queue for e in collect(everything, 7)} == {"jobs", "other"}


def test_a_due_event_when_a_delayed_item_comes_due(host: tuple[Engine, Path]) -> None:
    eng, data = host
    with subscriber.subscribe(data, "later") as sub:
        [item] = eng.enqueue("later", [NewItem(b"x", delay_ms=300)])
        got = collect(sub, 3, timeout_s=10)
    due = [e for e in got if e.kind == "due"]
    assert due and due[0].time == item.deadline
    assert eng.now() >= item.deadline


def test_discovery_errors_are_clear(tmp_path: Path) -> None:
    from dq.shm.errors import AttachError

    with pytest.raises(AttachError, match="no data directory"):
        subscriber.subscribe(tmp_path / "nope", "q")
    with pytest.raises(AttachError, match="not a dq data directory"):
        subscriber.subscribe(tmp_path, "q")
    (tmp_path / "LOCK").touch()  # a server used it: none serves rings there now
    with pytest.raises(AttachError, match="no rings served"):
        subscriber.subscribe(tmp_path, "q")
    (tmp_path / "dq-rings.json").write_text("{not json")
    with pytest.raises(AttachError, match="unreadable"):
        subscriber.submitter(tmp_path)


def test_client_subscribe(host: tuple[Engine, Path]) -> None:
    from dq.client import Client
    from dq.client.errors import UnsupportedAddress

    eng, data = host
    with Client("http://127.0.0.1:9") as dq:  # never connects: events come over shm
        with pytest.raises(UnsupportedAddress):
            dq.subscribe("jobs")
        with dq.subscribe("jobs", data_dir=str(data)) as sub:
            [item] = eng.enqueue("jobs", [NewItem(b"a")])
            # the due-poller may announce the item between its publication and the
            # "enqueued" event: compare the other kinds, in order
            kinds: list[tuple[str, tuple[int, ...]]] = []
            give_up = time.monotonic() + 10
            while len(kinds) < 2 and time.monotonic() < give_up:
                kinds += [(e.kind, e.ids) for e in sub.poll(0.2) if e.kind != "due"]
    assert kinds[:2] == [("queue_created", ()), ("enqueued", (item.id,))]


def test_closing_does_not_wait_for_a_stuck_subscriber(tmp_path: Path) -> None:
    eng = Engine.open(tmp_path, EngineConfig(fsync="never"))
    rings = RingsHost(eng, tmp_path, broadcast_size=1024, evict_after_s=60).start()
    stuck = subscriber.subscribe(tmp_path)  # never polls
    try:
        for _ in range(100):  # ~2 KiB of events: the writer must wrap, and waits
            eng.enqueue("q", [NewItem(b"x")])
        time.sleep(0.3)
        assert rings.events is not None and rings.events.writer.laps == 0
    finally:
        t0 = time.monotonic()
        rings.close()
        eng.close()
    assert time.monotonic() - t0 < 3  # not the 5 s join timeout: the wait gave up
    stuck.close()
