"""The compiled ring decoder (``shm/_session.c``) under hostile slots.

Hypothesis writes slots a client may write — any op, key and value, ``value_size`` beyond
the slot, PARTs before anything — and checks the session's answers against the op table
of ``docs/shm.md``, re-stated here from the document (not from the server's code): what
reaches the handler is exactly the fields decoded, every refusal has its status and its
words, every command gets exactly one answer, in ring order. A second process then
writes malformed slots into a live server's ring while a good client is served.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dq.shm import command_codec as codec
from dq.shm.command_ring import SLOT_SIZE, Op, Status
from dq.shm.server import ShmServer
from dq.storage import Engine, EngineConfig
from dq.storage.errors import InvalidQueueName
from dq.storage.types import check_queue_name
from tests.shm.ring_session import WAIT_S, Recorder, Served
from tests.shm.test_command_ring_hostile import Good

U64 = st.integers(0, 2**64 - 1)
SINGLE_OPS = [Op.PUT, Op.DELETE, Op.FIND, Op.REQUEUE, Op.EXTEND, Op.STATS, Op.BIND, Op.CONTINUE]


def _opt(v: int) -> int | None:
    return v or None


def _receipt(raw: bytes) -> str | bytes:
    """The receipt, or the malformed answer's words (docs/shm.md: ASCII, not empty)."""
    if any(b >= 0x80 for b in raw):
        return b"receipt is not ASCII"
    if not raw:
        return b"receipt is empty"
    return raw.decode("ascii")


def expected(op: int, key: bytes, value_size: int, value: bytes) -> tuple[Any, int, bytes]:
    """(the handler call or None, status, body) of one single-slot command on a bound
    ring whose handler answers ``Recorder``'s defaults."""
    a, b = struct.unpack("<QQ", key)
    if value_size > 1024:
        return None, Status.VALUE_TOO_LARGE, b"value_size exceeds the 1024-byte slot"
    if op == Op.PUT:
        return ("enqueue_one", value, _opt(a), _opt(b)), Status.OK, struct.pack("<QQ", 1, 2)
    if op == Op.DELETE:
        receipt = _receipt(value)
        if isinstance(receipt, bytes):
            return None, Status.MALFORMED, receipt
        return ("release_one", a, receipt), Status.OK, b""
    if op == Op.FIND:
        count, wait_ms, lease = struct.unpack("<IIQ", key)
        return ("find", max(count, 1), wait_ms, _opt(lease)), Status.OK, bytes(4)
    if op == Op.REQUEUE:
        if len(value) < 8:
            words = f"REQUEUE value must start with delay_ms u64 (size={len(value)})"
            return None, Status.MALFORMED, words.encode()
        receipt = _receipt(value[8:])
        if isinstance(receipt, bytes):
            return None, Status.MALFORMED, receipt
        (delay,) = struct.unpack_from("<Q", value)
        call = ("requeue", a, receipt, _opt(b), _opt(delay))
        return call, Status.OK, struct.pack("<Q", 5)
    if op == Op.EXTEND:
        receipt = _receipt(value)
        if isinstance(receipt, bytes):
            return None, Status.MALFORMED, receipt
        if b == 0:
            return None, Status.MALFORMED, b"EXTEND needs lease_ms > 0"
        body = struct.pack("<QH", 7, 3) + b"r.x"
        return ("extend", a, receipt, b), Status.OK, body
    if op == Op.STATS:
        return ("stats",), Status.OK, b"{}"
    if op == Op.BIND:
        try:
            check_queue_name(value.decode("ascii", "replace"))
        except InvalidQueueName as exc:
            return ("bind", value), Status.INVALID_QUEUE_NAME, str(exc).encode()
        return ("bind", value), Status.OK, b""
    if op == Op.CONTINUE:
        return None, Status.NO_CONTINUATION, b"no response continues"
    return None, Status.UNKNOWN_OP, f"unknown op {op}".encode()


def expected_all(sent: list[tuple[int, bytes, int, bytes]]) -> list[tuple[Any, int, int, bytes]]:
    """(call, status, flags, body) of each command in turn: an answer given at once that
    does not fit its slot ends there with MORE and its rest is what the next CONTINUE
    gets (a refusal's words too); a durable one is cut; any other op drops the rest."""
    rest = b""
    out: list[tuple[Any, int, int, bytes]] = []
    for op, key, size, value in sent:
        if op == Op.CONTINUE and size <= 1024:
            if rest:
                chunk, rest = rest[:1020], rest[1020:]
                out.append((None, Status.OK, int(bool(rest)), chunk))
            else:
                out.append((None, Status.NO_CONTINUATION, 0, b"no response continues"))
            continue
        if op != Op.CONTINUE:
            rest = b""
        call, status, body = expected(op, key, size, value)
        kept = len(body) > 1020 and op not in (Op.PUT, Op.DELETE, Op.REQUEUE)
        if kept:
            rest = body[1020:]
        out.append((call, status, int(kept), body[:1020]))
    return out


def flat_calls(handler: Recorder) -> list[tuple[Any, ...]]:
    """The handler's calls, a batch of a run counted as its commands one by one."""
    out: list[tuple[Any, ...]] = []
    for call in handler.calls:
        if call[0] == "enqueue":
            out.extend(("enqueue_one", *item) for item in call[1])
        elif call[0] == "release":
            out.extend(("release_one", *item) for item in call[1])
        else:
            out.append(call)
    return out


def raw_slot(served: Served, index: int, op: int, key: bytes, size: int, value: bytes) -> None:
    """A slot as a client writes it, ``value_size`` whatever the test says."""
    off = 24 + SLOT_SIZE * index
    mm = served.mm
    mm[off] = 0
    mm[off + 1] = op
    mm[off + 2 : off + 18] = key
    struct.pack_into("<I", mm, off + 18, size)
    mm[off + 22 : off + 22 + len(value)] = value
    struct.pack_into("<I", mm, off + 1046, 0)
    mm[off + 2074] = 0
    mm[off] = 1


def send(
    served: Served, slots: list[tuple[int, bytes, int, bytes]]
) -> list[tuple[int, int, bytes]]:
    """Write ``slots`` from ``head`` on, publish them at once, wait for the last one's
    answer; every slot's (status, flags, body), checked to be published in order."""
    client = served.client
    head = struct.unpack_from("<Q", served.mm, 0)[0]
    indexes = []
    for op, key, size, value in slots:
        index = (head + len(indexes)) % client.capacity
        raw_slot(served, index, op, key, size, value)
        indexes.append(index)
    struct.pack_into("<Q", served.mm, 0, (head + len(slots)) % client.capacity)
    client.wake_server()
    client.wait(indexes[-1], WAIT_S)
    answers = []
    for index in indexes:
        off = 24 + SLOT_SIZE * index
        assert served.mm[off + 2074] == 1, "an earlier slot was not answered first"
        (size,) = struct.unpack_from("<I", served.mm, off + 1046)
        assert 4 <= size <= 1024
        status, flags = served.mm[off + 1050], served.mm[off + 1051]
        answers.append((status, flags, bytes(served.mm[off + 1054 : off + 1050 + size])))
    assert struct.unpack_from("<Q", served.mm, 8)[0] == (head + len(slots)) % client.capacity
    return answers


one_slot = st.tuples(
    st.sampled_from([*SINGLE_OPS, 11, 200]),
    st.one_of(
        st.binary(min_size=16, max_size=16),
        st.tuples(U64, U64).map(lambda t: struct.pack("<QQ", *t)),
    ),
    st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"", b"r.1", b"\x80x", b"jobs", b"bad name"]),
        st.binary(min_size=8, max_size=8).map(lambda b: b + b"r.2"),
        st.binary(min_size=1000, max_size=1024),
    ),
    st.sampled_from([None, 1025, 0xFFFFFFFF]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(one_slot, min_size=1, max_size=15))
@example(  # a refusal too long for its slot continues, as any answer given at once
    [(Op.BIND, bytes(16), bytes(1000), None)] + [(Op.CONTINUE, bytes(16), b"", None)] * 4
)
def test_single_slot_commands_decode_as_the_doc_says(slots: list[Any]) -> None:
    with Served(16) as served:
        served.start()
        sent = [
            (op, key, len(value) if size is None else size, value) for op, key, value, size in slots
        ]
        answers = send(served, sent)
        assert served.failure is None
        wanted = expected_all(sent)
        assert answers == [(status, flags, body) for _, status, flags, body in wanted]
        assert flat_calls(served.handler) == [call for call, *_ in wanted if call is not None]


any_slot = st.tuples(
    st.sampled_from([*SINGLE_OPS, Op.PART, Op.PART, Op.PUT_MANY, Op.DELETE_MANY, 77]),
    st.binary(min_size=16, max_size=16),
    st.binary(max_size=300),
    st.sampled_from([None, None, None, 1025]),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(any_slot, min_size=1, max_size=14))
def test_any_slots_get_one_answer_each_in_order(slots: list[Any]) -> None:
    """PARTs anywhere, batch ops with random bodies: every slot is answered once, in order
    (the last command is a STATS, so no PART is left waiting), and what reaches the
    handler is typed as the doc's fields are."""
    with Served(16) as served:
        served.start()
        sent = [
            (op, key, len(value) if size is None else size, value) for op, key, value, size in slots
        ]
        sent.append((Op.STATS, bytes(16), 0, b""))
        answers = send(served, sent)
        assert served.failure is None
        assert all(status in iter(Status) for status, _, _ in answers)
        for call in flat_calls(served.handler):
            if call[0] in ("put_many", "delete_many"):
                for item in call[1]:
                    assert all(isinstance(f, (bytes, str, int, type(None))) for f in item)
                    if call[0] == "delete_many":
                        assert item[1] and item[1].isascii()
                    else:
                        assert len(item[0]) <= len(b"".join(s[3] for s in sent))


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.binary(max_size=30),
            st.integers(0, 2**64 - 1),
            st.integers(0, 2**64 - 1),
            st.one_of(st.none(), st.text(min_size=1, max_size=20)),
        ),
        max_size=60,
    ),
    st.data(),
)
def test_batch_bodies_over_parts_round_trip(items: list[Any], data: st.DataObject) -> None:
    """A PUT_MANY's body cut anywhere over PARTs is the handler's items, exactly."""
    key, body = codec.encode_put_many(
        [(v, d, dl, k) for v, d, dl, k in items if k is None or len(k.encode()) <= 255]
    )
    cuts = sorted(data.draw(st.lists(st.integers(0, len(body)), max_size=3)))
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    if any(len(p) > 1024 for p in pieces):
        pieces = [body[i : i + 1024] for i in range(0, len(body), 1024)] or [b""]
    with Served(16) as served:
        served.start()
        slots = [(Op.PART, bytes(16), len(p), p) for p in pieces[:-1]]
        slots.append((Op.PUT_MANY, key, len(pieces[-1]), pieces[-1]))
        answers = send(served, slots)
        assert answers[0][0] == Status.OK
        (call,) = served.handler.calls
        sent = [
            (v, d or None, dl or None, k)
            for v, d, dl, k in items
            if k is None or len(k.encode()) <= 255
        ]
        assert call == ("put_many", sent)


# ---- malformed slots written from a second process ---------------------------------------

WRITER = Path(__file__).with_name("hostile_writer.py")


@pytest.mark.integration  # a second process writes into a live server's ring
def test_malformed_slots_from_another_process_hurt_only_that_client(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Engine.open(data, EngineConfig(fsync="never")) as engine:
        server = ShmServer(engine, data).start()
        good = Good(server)
        try:
            env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
            writers = [
                subprocess.Popen(
                    [sys.executable, str(WRITER), str(data), str(seed), "400"],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for seed in (1, 2)
            ]
            end = time.monotonic() + 60
            while any(w.poll() is None for w in writers) and time.monotonic() < end:
                if len(good.sent) < 500:  # check_queue reads up to 1000
                    good.put()
                time.sleep(0.005)
            for w in writers:
                out, err = w.communicate(timeout=60)
                assert w.returncode == 0, err
                answered, _dropped = (int(x) for x in out.split())
                assert answered > 0
            good.put()
            good.check_queue(engine)
            assert server.session_count >= 1
            fresh = Good(server)  # the server attaches and serves a new client
            fresh.put()
            fresh.close()
        finally:
            good.close()
            server.close()
