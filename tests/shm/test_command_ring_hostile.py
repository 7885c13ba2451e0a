"""A hostile client cannot crash the server, corrupt a queue or disturb other clients.

Each case attaches a well-behaved client and a hostile one, lets the hostile one write
whatever it likes into its own ring, then checks that the server still answers the good
client, that the hostile client got error responses or was dropped (ring unlinked), and
that the good client's queue holds exactly what it enqueued.
"""

from __future__ import annotations

import random
import struct
import threading
from functools import partial

import pytest

from dq.shm import _atomics as at
from dq.shm import command_codec as codec
from dq.shm.attach import SHM_DIR, Attachment, attach
from dq.shm.command_ring import RESPONSE, RESPONSE_READY, ClientRing, Op, Status, slot_offset
from dq.shm.server import ShmServer
from dq.storage import Engine
from tests.shm.conftest import WAIT_S, eventually


def dropped(a: Attachment) -> bool:
    """The server closed our socket and unlinked our ring."""
    a.sock.settimeout(0.05)
    try:
        eof = a.sock.recv(1) == b""
    except TimeoutError:
        eof = False
    return eof and not (SHM_DIR / a.name.lstrip("/")).exists()


def answered_or_dropped(a: Attachment, head: int) -> bool:
    return dropped(a) or at.load_u64(a.mm, 8) == head


class Good:
    """A well-behaved client that checks the server still serves it exactly."""

    def __init__(self, server: ShmServer) -> None:
        self.a = attach(server.data_dir, queue="good", capacity=4)
        self.ring = ClientRing(self.a.mm, spin_us=0.0)
        self.sent: list[bytes] = []

    def put(self) -> None:
        value = f"good-{len(self.sent)}".encode()
        r = self.ring.call(Op.PUT, codec.encode_put(None, None), value, timeout_s=WAIT_S)
        assert r.status == Status.OK
        self.sent.append(value)

    def check_queue(self, engine: Engine) -> None:
        got = engine.dequeue("good", 1000, 60_000)
        assert [d.value for d in got] == self.sent
        stats = engine.stats("good")
        assert stats.leased == len(self.sent)

    def close(self) -> None:
        self.ring.close()
        self.a.close()


def raw_command(mm: object, index: int, op: int, key: bytes, value_size: int, value: bytes) -> None:
    off = slot_offset(index)
    view = memoryview(mm)  # type: ignore[arg-type]
    view[off + 1] = op
    view[off + 2 : off + 18] = key
    struct.pack_into("<I", view, off + 18, value_size)
    view[off + 22 : off + 22 + len(value)] = value
    view[off + RESPONSE_READY] = 0
    view[off] = 1
    view.release()


def publish_head(mm: object, head: int) -> None:
    at.store_u64(mm, 0, head)  # type: ignore[arg-type]
    at.futex_wake(mm, 0)  # type: ignore[arg-type]


def response_of(mm: object, index: int) -> int | None:
    off = slot_offset(index)
    if at.spin_wait_u8(mm, off + RESPONSE_READY, 0, WAIT_S) is None:  # type: ignore[arg-type]
        return None
    return memoryview(mm)[off + RESPONSE]  # type: ignore[arg-type,no-any-return]


def test_value_size_beyond_the_slot_is_refused_and_the_client_served_on(
    served: tuple[Engine, ShmServer],
) -> None:
    engine, server = served
    good = Good(server)
    bad = attach(server.data_dir, queue="bad", capacity=4)
    try:
        raw_command(bad.mm, 0, Op.PUT, bytes(16), 5000, b"x" * 16)
        publish_head(bad.mm, 1)
        assert response_of(bad.mm, 0) == Status.VALUE_TOO_LARGE
        raw_command(bad.mm, 1, Op.PUT, bytes(16), 0xFFFFFFFF, b"")
        publish_head(bad.mm, 2)
        assert response_of(bad.mm, 1) == Status.VALUE_TOO_LARGE
        good.put()
        raw_command(bad.mm, 2, Op.PUT, bytes(16), 3, b"abc")
        publish_head(bad.mm, 3)
        assert response_of(bad.mm, 2) == Status.OK
        assert [d.value for d in engine.dequeue("bad", 10, None)] == [b"abc"]
        good.check_queue(engine)
    finally:
        good.close()
        bad.close()


@pytest.mark.parametrize("field", ["head", "head-huge", "not-ready"])
def test_a_broken_header_or_slot_drops_only_that_client(
    served: tuple[Engine, ShmServer], field: str
) -> None:
    engine, server = served
    good = Good(server)
    bad = attach(server.data_dir, queue="bad", capacity=4)
    try:
        good.put()
        at.store_u64(bad.mm, 8, 1 << 63)  # tail and capacity are the server's: ignored
        at.store_u64(bad.mm, 16, 1 << 63)
        if field == "head":
            publish_head(bad.mm, 4)  # == capacity
        elif field == "head-huge":
            publish_head(bad.mm, (1 << 64) - 1)
        else:
            publish_head(bad.mm, 2)  # slots 0 and 1 never marked ready
        assert eventually(lambda: dropped(bad))
        good.put()
        good.check_queue(engine)
    finally:
        good.close()
        bad.close()


def test_random_bytes_in_every_slot(served: tuple[Engine, ShmServer]) -> None:
    engine, server = served
    good = Good(server)
    rng = random.Random(5)
    try:
        for _ in range(20):
            bad = attach(server.data_dir, queue="bad", capacity=8)
            try:
                view = memoryview(bad.mm)
                view[24:] = rng.randbytes(len(view) - 24)
                for i in range(7):  # some slots look like commands, all with random fields
                    if rng.random() < 0.8:
                        view[slot_offset(i)] = 1
                        view[slot_offset(i) + 1] = rng.randrange(9)
                view.release()
                publish_head(bad.mm, 7)
                # every slot is answered or the client is dropped; never a hang or a crash
                assert eventually(partial(answered_or_dropped, bad, 7))
            finally:
                bad.close()
            good.put()
        good.check_queue(engine)
        assert eventually(lambda: server.session_count == 1)
    finally:
        good.close()


def test_ready_toggled_and_fields_rewritten_mid_command(served: tuple[Engine, ShmServer]) -> None:
    engine, server = served
    good = Good(server)
    bad = attach(server.data_dir, queue="bad", capacity=4)
    stop = threading.Event()

    def scribble() -> None:
        rng = random.Random(7)
        view = memoryview(bad.mm)
        try:
            while not stop.is_set():
                off = slot_offset(rng.randrange(4))
                view[off] = rng.randrange(2)
                view[off + 1] = rng.randrange(8)
                struct.pack_into("<I", view, off + 18, rng.choice([3, 1024, 1025, 1 << 31]))
                view[off + 2 : off + 18] = rng.randbytes(16)
        finally:
            view.release()

    try:
        raw_command(bad.mm, 0, Op.PUT, bytes(16), 3, b"abc")
        thread = threading.Thread(target=scribble)
        thread.start()
        try:
            for head in (1, 2, 3, 0, 1, 2):
                publish_head(bad.mm, head)
                good.put()
        finally:
            stop.set()
            thread.join(WAIT_S)
        good.check_queue(engine)
        # whatever the scribbler made of queue "bad", it is a readable, consistent queue
        bad_items = engine.dequeue("bad", 1000, 60_000) if "bad" in engine.list_queues() else []
        assert all(isinstance(d.value, bytes) for d in bad_items)
    finally:
        good.close()
        bad.close()


def test_many_hostile_clients_do_not_leak_rings(served: tuple[Engine, ShmServer]) -> None:
    _, server = served
    for _ in range(10):
        bad = attach(server.data_dir, capacity=2)
        publish_head(bad.mm, 3)
        assert eventually(partial(dropped, bad))
        bad.close()
    assert eventually(lambda: server.session_count == 0)
    assert list(SHM_DIR.glob(f"{server.shm_prefix}*")) == []
