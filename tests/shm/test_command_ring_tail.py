"""The ring's server writes a slot's answer before it moves ``tail`` past the slot.

``docs/shm.md`` ("Hand-off"): the server writes ``response_size`` and ``response``, sets
``response_ready``, and only then moves ``tail``, "the next slot the server answers".
The Python client never leans on that: it reuses a slot only after reading its answer.
A client written from the document may: every slot before ``tail`` is answered, so it
reads their answers and fills them with new commands at once. Had the server moved
``tail`` first, the answer it writes afterwards would land on the new command's slot:
the old command's answer lost, the new one "answered" with it.

This test is such a client, written from the document's offsets and hand-off as the C
client ``tests/shm/c/ring_client.c`` is (``dq.shm.command_ring`` is not used; the
bodies are encoded with ``dq.shm.command_codec``). It keeps the ring full of commands
spanning several slots — PUT_MANY and DELETE_MANY over PARTs, FINDs whose answers
spread over PARTs or continue by CONTINUE — and runs of single PUTs and DELETEs, and
refills each slot as soon as ``tail`` passes it. The server calls the test at every move
of ``tail`` (``ShmServer.tail_watch``, ``AdvanceWatch``): it checks that each slot passed has its
answer ready, then stops the server right there until the client has read those
answers and refilled the slots — the worst moment for a server that advanced too early,
made deterministic.
"""

from __future__ import annotations

import itertools
import queue
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dq.shm import _atomics as at
from dq.shm import command_codec as codec
from dq.shm.attach import attach
from dq.shm.server import ShmServer
from dq.storage import Engine
from tests.shm.conftest import WAIT_S, serving

CAPACITY = 8
QUEUE = "tail"

# docs/shm.md, "Command ring": header and slot offsets
HEAD, TAIL, CAPACITY_OFF, SLOTS, SLOT_SIZE = 0, 8, 16, 24, 2080
READY, OP, KEY, VALUE_SIZE, VALUE = 0, 1, 2, 18, 22
RESPONSE_SIZE, RESPONSE, RESPONSE_READY = 1046, 1050, 2074
PUT, DELETE, FIND, STATS, CONTINUE, PART, PUT_MANY, DELETE_MANY = 0, 1, 2, 5, 7, 8, 9, 10
OK, NO_CONTINUATION = 0, 17
MORE = 0x01
ZERO_KEY = bytes(16)
U32 = struct.Struct("<I")

Slot = tuple[int, bytes, bytes]  # op, key, value
Answer = tuple[int, int, bytes]  # status, flags, body


def slot_offset(index: int) -> int:
    return SLOTS + SLOT_SIZE * index


class AdvanceWatch:
    """Called by the server each time it moves a ring's ``tail`` (``ShmServer.tail_watch``,
    test only): each slot passed must have ``response_ready`` set; then the server waits
    there until the client has taken its turn (read the answers, refilled the slots)."""

    def __init__(self, mm: Any) -> None:
        self.mm = mm
        self.violations: list[str] = []
        self.advances: list[int] = []
        self.turns: queue.Queue[threading.Event] = queue.Queue()
        self._lock = threading.Lock()
        self._lockstep = True
        self._tail = 0

    def moved(self, tail: int) -> None:
        start = self._tail
        slots = (tail - start) % CAPACITY
        self._tail = tail
        for i in range(slots):
            index = (start + i) % CAPACITY
            if at.load_u8(self.mm, SLOTS + SLOT_SIZE * index + RESPONSE_READY) != 1:
                self.violations.append(
                    f"tail moved past slot {index} (by {slots} from {start}) "
                    "before its answer was ready"
                )
        with self._lock:
            self.advances.append(slots)
            if not self._lockstep:
                return
            turn = threading.Event()
            self.turns.put(turn)
        if not turn.wait(WAIT_S):
            self.violations.append("the client never took its turn")

    def stop(self) -> None:
        """Let the server run freely again."""
        with self._lock:
            self._lockstep = False
        while True:
            try:
                self.turns.get_nowait().set()
            except queue.Empty:
                return


@dataclass
class Unit:
    """One command (its PARTs, the op, and for a FIND the CONTINUEs sent with it) and
    what to do with the answers of its slots, in ring order."""

    name: str
    slots: list[Slot]
    done: Callable[[list[Answer]], None]
    indexes: list[int] = field(default_factory=list)
    answers: dict[int, Answer] = field(default_factory=dict)


class DocClient:
    """The client side of docs/shm.md's hand-off, slot by slot, that reuses a slot as
    soon as ``tail`` has passed it."""

    def __init__(self, mm: Any) -> None:
        self.mm = mm
        self.view = memoryview(mm)
        self.capacity = at.load_u64(mm, CAPACITY_OFF)
        self.head = at.load_u64(mm, HEAD)
        self.tail = at.load_u64(mm, TAIL)
        self.to_send: deque[Unit] = deque()
        self.in_flight: deque[Unit] = deque()
        self.owner: dict[int, Unit] = {}

    def free(self) -> int:
        return int((at.load_u64(self.mm, TAIL) - self.head - 1) % self.capacity)

    def fill(self) -> None:
        """Send every queued unit that fits in the free slots, in order; wake the server
        once."""
        sent = False
        while self.to_send and len(self.to_send[0].slots) <= self.free():
            unit = self.to_send.popleft()
            for op, key, value in unit.slots:
                unit.indexes.append(self._write(op, key, value))
                self.owner[unit.indexes[-1]] = unit
            self.in_flight.append(unit)
            sent = True
        if sent:
            at.futex_wake(self.mm, HEAD, 1)

    def _write(self, op: int, key: bytes, value: bytes) -> int:
        mm, view, index = self.mm, self.view, self.head
        off = slot_offset(index)
        at.store_u8(mm, off + READY, 0)
        view[off + OP] = op
        view[off + KEY : off + KEY + 16] = key
        U32.pack_into(view, off + VALUE_SIZE, len(value))
        view[off + VALUE : off + VALUE + len(value)] = value
        U32.pack_into(view, off + RESPONSE_SIZE, 0)
        at.store_u8(mm, off + RESPONSE_READY, 0)
        at.store_u8(mm, off + READY, 1)
        self.head = (index + 1) % self.capacity
        at.store_u64(mm, HEAD, self.head)
        return index

    def collect(self) -> None:
        """Read the answer of every slot ``tail`` passed since the last look (the
        document says they are complete), and hand each finished unit its answers."""
        tail = at.load_u64(self.mm, TAIL)
        while self.tail != tail:
            index = self.tail
            off = slot_offset(index)
            assert at.load_u8(self.mm, off + RESPONSE_READY) == 1, (
                f"tail passed slot {index} before its answer was ready"
            )
            (size,) = U32.unpack_from(self.view, off + RESPONSE_SIZE)
            assert 4 <= size <= 1024, f"slot {index}: response_size {size}"
            raw = bytes(self.view[off + RESPONSE : off + RESPONSE + size])
            unit = self.owner.pop(index)
            unit.answers[index] = (raw[0], raw[1], raw[4:])
            self.tail = (index + 1) % self.capacity
        while self.in_flight and len(self.in_flight[0].answers) == len(self.in_flight[0].slots):
            unit = self.in_flight.popleft()
            unit.done([unit.answers[i] for i in unit.indexes])

    def idle(self) -> bool:
        return not self.to_send and not self.in_flight


def joined(name: str, answers: list[Answer]) -> bytes:
    """The body of a command answered over several slots (docs/shm.md, "Batches in one
    command"): every slot carries the status, MORE while the body goes on."""
    body = b""
    for i, (status, flags, chunk) in enumerate(answers):
        assert status == OK, f"{name}: slot {i} answered status {status}: {chunk!r}"
        body += chunk
        if not flags & MORE:
            assert all(not rest[2] for rest in answers[i + 1 :]), f"{name}: body after its end"
            return body
    raise AssertionError(f"{name}: the answer goes on past its slots")


class Workload:
    """Values enqueued in batches and alone; FINDs lease them, and each FIND's
    deliveries are released by a DELETE and a DELETE_MANY sent as soon as it is read."""

    def __init__(self, client: DocClient) -> None:
        self.client = client
        self.ids: dict[int, bytes] = {}  # id -> value, from the PUT answers
        self.delivered: dict[int, bytes] = {}
        self.released: list[int] = []
        self.kinds: set[str] = set()
        self.values = 0

    def value(self) -> bytes:
        self.values += 1
        return f"value {self.values:04d} ".encode().ljust(300, b".")

    def _send(self, name: str, slots: list[Slot], done: Callable[[list[Answer]], None]) -> None:
        def finish(answers: list[Answer]) -> None:
            done(answers)
            self.kinds.add(name)

        self.client.to_send.append(Unit(name, slots, finish))

    def put_many(self, n: int) -> None:
        values = [self.value() for _ in range(n)]
        key, body = codec.encode_put_many([(v, None, None, None) for v in values])
        pieces = [body[i : i + 1024] for i in range(0, len(body), 1024)]
        assert len(pieces) >= 2, "a PUT_MANY over PARTs"
        slots = [(PART, ZERO_KEY, p) for p in pieces[:-1]] + [(PUT_MANY, key, pieces[-1])]

        def done(answers: list[Answer]) -> None:
            got = codec.decode_put_many_ok(joined("PUT_MANY", answers), n)
            for (item_id, _deadline, duplicate, _replaced), v in zip(got, values, strict=True):
                assert not duplicate and item_id not in self.ids
                self.ids[item_id] = v

        self._send("PUT_MANY", slots, done)

    def put(self) -> None:
        v = self.value()

        def done(answers: list[Answer]) -> None:
            ((status, _flags, body),) = answers
            assert status == OK, (status, body)
            item_id, _deadline = codec.decode_put_ok(body)
            assert item_id not in self.ids
            self.ids[item_id] = v

        self._send("PUT", [(PUT, codec.encode_put(None, None), v)], done)

    def find(self, count: int, parts: int, continues: int) -> None:
        """A FIND with ``parts`` empty PARTs before it and ``continues`` CONTINUEs after:
        its answer spreads over its slots, what does not fit comes by CONTINUE, and the
        CONTINUEs past the end are answered ``no_continuation``."""
        slots = [(PART, ZERO_KEY, b"")] * parts
        slots += [(FIND, codec.encode_find(count, 0, 600_000), b"")]
        slots += [(CONTINUE, ZERO_KEY, b"")] * continues
        name = "FIND" + (" over PARTs" if parts else "") + " with CONTINUE"

        def done(answers: list[Answer]) -> None:
            own, extra = answers[: parts + 1], answers[parts + 1 :]
            body, more = b"", True
            for i, (status, flags, chunk) in enumerate(own):
                assert status == OK, (name, i, status, chunk)
                body += chunk
                more = bool(flags & MORE)
            for status, flags, chunk in extra:
                if more:
                    assert status == OK, (name, "continue", status, chunk)
                    body += chunk
                    more = bool(flags & MORE)
                else:
                    assert status == NO_CONTINUATION, (name, "continue past the end", status)
            assert not more, f"{name}: the answer goes on past its CONTINUEs"
            got = codec.decode_deliveries(body)
            assert len(got) <= count
            for d in got:
                assert d.id not in self.delivered, f"item {d.id} delivered twice"
                self.delivered[d.id] = d.value
            if got:
                self.release([(d.id, d.receipt) for d in got])

        self._send(name, slots, done)

    def release(self, items: list[tuple[int, str]]) -> None:
        """The first alone (DELETE), the rest in a DELETE_MANY split over PARTs."""
        first, rest = items[0], items[1:]
        key, value = codec.encode_item(*first)

        def done_one(answers: list[Answer]) -> None:
            ((status, _flags, body),) = answers
            assert status == OK, (status, body)
            self.released.append(first[0])

        self._send("DELETE", [(DELETE, key, value)], done_one)
        if not rest:
            return
        key, body = codec.encode_delete_many(rest)
        cut = [0, len(body) // 3, 2 * len(body) // 3, len(body)]
        pieces = [body[a:b] for a, b in itertools.pairwise(cut)]
        slots = [(PART, ZERO_KEY, p) for p in pieces[:-1]] + [(DELETE_MANY, key, pieces[-1])]

        def done_many(answers: list[Answer]) -> None:
            got = codec.decode_delete_many_ok(joined("DELETE_MANY", answers), len(rest))
            assert [status for status, _ in got] == [OK] * len(rest), got
            self.released.extend(item_id for item_id, _ in rest)

        self._send("DELETE_MANY", slots, done_many)

    def stats(self) -> None:
        def done(answers: list[Answer]) -> None:
            ((status, _flags, body),) = answers
            assert status == OK and body.startswith(b"{"), (status, body)

        self._send("STATS", [(STATS, ZERO_KEY, b"")], done)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, ShmServer]]:
    """The conftest's, with every write synced and the queue made."""
    with serving(tmp_path / "data", "always", (QUEUE,)) as pair:
        yield pair


def test_every_slot_tail_passes_is_answered_for_a_client_that_refills_at_once(
    served: tuple[Engine, ShmServer],
) -> None:
    engine, server = served
    watch = AdvanceWatch(None)
    server.tail_watch = watch.moved  # for the rings attached from now on
    attachment = attach(server.data_dir, queue=QUEUE, capacity=CAPACITY)
    watch.mm = attachment.mm
    client = DocClient(attachment.mm)
    work = Workload(client)
    for _ in range(4):
        work.put_many(8)  # 8 x 321 bytes: two PARTs and the op
        work.put()
        work.put()
        work.find(6, parts=1, continues=2)  # ~2.2 KB: two slots, then one CONTINUE
        work.put()
        work.find(4, parts=0, continues=2)  # ~1.5 KB: one slot, then one CONTINUE
        work.stats()
    total = 4 * 11
    finds = 0
    failed: AssertionError | None = None
    try:
        while not client.idle():
            client.fill()
            try:
                turn = watch.turns.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(
                    f"the server moved tail no more ({len(client.in_flight)} commands "
                    "waiting for an answer)"
                ) from None
            try:
                client.collect()
                if client.idle() and len(work.delivered) < total and finds < 20:
                    finds += 1  # what the scripted FINDs did not reach
                    work.find(6, parts=2, continues=1)
                client.fill()  # refilled before the server goes on from its advance
            finally:
                turn.set()
    except AssertionError as exc:
        failed = exc  # reported after what the server-side check saw
    finally:
        watch.stop()
        client.view.release()
        attachment.close()

    assert watch.violations == []
    if failed is not None:
        raise failed
    assert len(work.ids) == total
    assert work.delivered == work.ids, "every item delivered once, with its value"
    assert sorted(work.released) == sorted(work.ids)
    assert engine.stats(QUEUE).pending == 0
    assert work.kinds == {
        "PUT",
        "PUT_MANY",
        "FIND with CONTINUE",
        "FIND over PARTs with CONTINUE",
        "DELETE",
        "DELETE_MANY",
        "STATS",
    }
    assert max(watch.advances) >= 3, "the server moved tail past several slots at once"
