"""The compiled ring decoder (``shm/_session.c``) under hostile slots.

Hypothesis writes slots a client may write — any op, key and value, ``value_size`` beyond
the slot, PARTs before anything — and checks the session's answers against the op table
of ``docs/shm.md``, re-stated here from the document (not from the server's code): what
reaches the handler is exactly the fields decoded, every refusal has its status and its
words, every command gets exactly one answer, in ring order. A second process then
writes malformed slots into a live server's ring while a good client is served.
"""

from __future__ import annotations

import dataclasses
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
from dq.shm.command_ring import FLAG_GROUPS, FLAG_MORE, SLOT_SIZE, Op, Status
from dq.shm.errors import MalformedSlot
from dq.shm.server import ShmServer
from dq.storage import Engine, EngineConfig
from dq.storage.errors import InvalidQueueName
from dq.storage.types import Delivery, ItemStats, NewItem, check_queue_name
from dq.storage.waits import Leased
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


def expected_all(
    sent: list[tuple[int, bytes, int, bytes]], groups: bool = False
) -> list[tuple[Any, int, int, bytes]]:
    """(call, status, flags, body) of each command in turn: an answer given at once that
    does not fit its slot ends there with MORE and its rest is what the next CONTINUE
    gets (a refusal's words too, with the answer's other flags); a durable one is cut;
    any other op drops the rest. ``groups``: the client asked for groups at attach, so
    an ok FIND answer has GROUPS."""
    rest, rest_flags = b"", 0
    out: list[tuple[Any, int, int, bytes]] = []
    for op, key, size, value in sent:
        if op == Op.CONTINUE and size <= 1024:
            if rest:
                chunk, rest = rest[:1020], rest[1020:]
                out.append((None, Status.OK, rest_flags | int(bool(rest)), chunk))
            else:
                out.append((None, Status.NO_CONTINUATION, 0, b"no response continues"))
            continue
        if op != Op.CONTINUE:
            rest = b""
        call, status, body = expected(op, key, size, value)
        flags = FLAG_GROUPS if groups and op == Op.FIND and status == Status.OK else 0
        kept = len(body) > 1020 and op not in (Op.PUT, Op.DELETE, Op.REQUEUE)
        if kept:
            rest, rest_flags = body[1020:], flags
        out.append((call, status, flags | int(kept), body[:1020]))
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
@given(st.lists(one_slot, min_size=1, max_size=15), st.booleans())
@example(  # a refusal too long for its slot continues, as any answer given at once
    [(Op.BIND, bytes(16), bytes(1000), None)] + [(Op.CONTINUE, bytes(16), b"", None)] * 4,
    False,
)
def test_single_slot_commands_decode_as_the_doc_says(slots: list[Any], groups: bool) -> None:
    with Served(16, groups=groups) as served:
        served.start()
        sent = [
            (op, key, len(value) if size is None else size, value) for op, key, value, size in slots
        ]
        answers = send(served, sent)
        assert served.failure is None
        wanted = expected_all(sent, groups)
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


# ---- deliveries and their groups: what the session encodes, what a client decodes --------

#: groups the engine keeps (1-128 printable ASCII), and none
GOOD_GROUP = st.one_of(
    st.none(),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=128),
)
#: groups the ring cannot carry (its group_len is a u8 of ASCII bytes): a bug upstream,
#: which the session answers ``internal`` rather than cutting or wrapping the length
BAD_GROUP = st.one_of(
    st.just(""),
    st.text(st.characters(max_codepoint=0x7F), min_size=256, max_size=400),
    st.text(st.characters(min_codepoint=0x80, max_codepoint=0x2FF), min_size=1, max_size=4),
    st.binary(min_size=1, max_size=4),
    st.integers(),
)


def _delivery(n: int, value: bytes, group: Any) -> Delivery:
    stats = ItemStats(1_800_000_000_000 + n, n, n % 7)
    return Delivery(n + 1, f"r{n}.{n}", value, 1_800_000_000_500 + n, stats, 2_000_000 + n, group)


def doc_find_body(deliveries: list[Delivery], groups: bool) -> bytes:
    """A FIND answer's body as docs/shm.md lays it out ("Ops", a delivery), re-stated
    here: n u32, then per delivery its 50-byte head (51 with GROUPS: group_len u8), the
    receipt, the value, and with GROUPS the group."""
    out = [struct.pack("<I", len(deliveries))]
    for d in deliveries:
        receipt = d.receipt.encode()
        head = struct.pack(
            "<QQQQQIHI",
            d.id,
            d.deadline,
            d.lease_expires,
            d.stats.enqueue_time,
            d.stats.requeue_time,
            d.stats.dequeue_count,
            len(receipt),
            len(d.value),
        )
        group = (d.group or "").encode() if groups else b""
        out += [head, bytes([len(group)]) if groups else b"", receipt, d.value, group]
    return b"".join(out)


def _carried(group: Any) -> bool:
    """Whether the ring can carry ``group``: none, or 1-255 ASCII characters."""
    return group is None or (isinstance(group, str) and group.isascii() and 1 <= len(group) <= 255)


def _chunks(served: Served, key: bytes) -> list[tuple[int, int, bytes]]:
    """A FIND's answer chunk by chunk, CONTINUE after CONTINUE: (status, flags, body)."""
    client = served.client
    r = client.wait(client.submit(Op.FIND, key, b""), WAIT_S)
    chunks = [(r.status, r.flags, r.body)]
    while r.more:
        r = client.call(Op.CONTINUE, bytes(16), b"", timeout_s=WAIT_S)
        chunks.append((r.status, r.flags, r.body))
    return chunks


@settings(max_examples=120, deadline=None)
@given(
    st.lists(
        st.tuples(st.binary(max_size=1100), st.one_of(GOOD_GROUP, GOOD_GROUP, BAD_GROUP)),
        max_size=8,
    ),
    st.booleans(),
)
def test_deliveries_and_their_groups_encode_as_the_doc_says(
    items: list[tuple[bytes, Any]], groups: bool
) -> None:
    """With GROUPS asked for, every chunk of an ok FIND answer has the flag and the body
    is the document's layout with groups; without, the layout without them, whatever the
    groups (never read). A group the ring cannot carry is answered ``internal``, and the
    session serves on."""
    deliveries = [_delivery(n, v, g) for n, (v, g) in enumerate(items)]
    ok = not groups or all(_carried(g) for _, g in items)
    with Served(4, groups=groups) as served:
        served.handler.answers.append(Leased(deliveries))
        served.start()
        chunks = _chunks(served, codec.encode_find(8, 0, 30_000))
        if not ok:
            assert chunks == [(Status.INTERNAL, 0, b"internal error: ValueError")]
        else:
            body = doc_find_body(deliveries, groups)
            wanted = [body[i : i + 1020] for i in range(0, len(body), 1020)]
            assert [c[2] for c in chunks] == wanted
            for n, (status, flags, _) in enumerate(chunks):
                more = FLAG_MORE if n < len(chunks) - 1 else 0
                assert (status, flags) == (Status.OK, (FLAG_GROUPS if groups else 0) | more)
            got = codec.decode_deliveries(body, FLAG_GROUPS if groups else 0)
            sent = [d if groups else dataclasses.replace(d, group=None) for d in deliveries]
            assert got == sent
        # served on: the next command is answered as always
        stats = served.client.call(Op.STATS, bytes(16), b"", timeout_s=WAIT_S)
        assert (stats.status, stats.body) == (Status.OK, b"{}")
        assert served.failure is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=40), GOOD_GROUP), max_size=4),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
    st.integers(0, 8),
)
def test_find_answers_with_hostile_lengths_decode_or_are_malformed(
    items: list[tuple[bytes, Any]], writes: list[tuple[int, int]], cut: int
) -> None:
    """A client decoding an answer with GROUPS whose lengths lie (``group_len``, the
    receipt's and value's lengths, the count, a body cut short) gets ``MalformedSlot`` or
    deliveries made of the body's own bytes, never an IndexError or a group read past
    the body."""
    body = bytearray(doc_find_body([_delivery(n, v, g) for n, (v, g) in enumerate(items)], True))
    for at, byte in writes:
        if body:
            body[at % len(body)] = byte
    raw = bytes(body[: max(0, len(body) - cut)])
    try:
        got = codec.decode_deliveries(raw, FLAG_GROUPS)
    except MalformedSlot:
        return
    for d in got:
        assert d.group is None or (d.group.isascii() and 1 <= len(d.group) <= 255)
        assert d.group is None or d.group.encode() in raw
    assert sum(51 + len(d.receipt) + len(d.value) + len(d.group or "") for d in got) <= len(raw)


# ---- malformed slots written from a second process ---------------------------------------

WRITER = Path(__file__).with_name("hostile_writer.py")


@pytest.mark.integration  # a second process writes into a live server's ring
def test_malformed_slots_from_another_process_hurt_only_that_client(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Engine.open(data, EngineConfig(fsync="never")) as engine:
        # the hostile rings' FINDs find grouped items (and ungrouped ones) to answer
        grouped = [NewItem(b"h%d" % n, group=f"g{n}" if n % 2 else None) for n in range(300)]
        engine.enqueue("hostile", grouped)
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
