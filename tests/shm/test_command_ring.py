"""The command ring's layout and slot protocol, without a server: docs/shm.md byte for byte."""

from __future__ import annotations

import mmap
import re
import struct
import threading
from pathlib import Path

import pytest

from dq.shm import _atomics as at
from dq.shm import command_codec as codec
from dq.shm.command_ring import (
    RESPONSE_BODY_MAX,
    SLOT_SIZE,
    ClientRing,
    Op,
    ServerRing,
    Status,
    encode_response,
    ring_size,
)
from dq.shm.errors import MalformedSlot, ProtocolError, RingTimeout, ValueTooLargeForRing
from dq.storage.types import Delivery, ItemStats

DOC = Path(__file__).resolve().parents[2] / "docs" / "shm.md"


def doc_example(name: str) -> bytes:
    text = DOC.read_text()
    match = re.search(rf"<!-- example:{name} -->\n```\n(.*?)```", text, re.S)
    assert match is not None, name
    return bytes.fromhex(match.group(1).replace("\n", " "))


def pair(capacity: int = 4) -> tuple[mmap.mmap, ServerRing, ClientRing]:
    mm = mmap.mmap(-1, ring_size(capacity))
    server = ServerRing(mm, capacity)
    return mm, server, ClientRing(mm, spin_us=0.0)


def test_sizes_match_the_original() -> None:
    assert SLOT_SIZE == 2080
    assert ring_size(64) == 24 + 2080 * 64 == 133_144
    assert RESPONSE_BODY_MAX == 1020
    assert [int(op) for op in (Op.PUT, Op.DELETE, Op.FIND)] == [0, 1, 2]


def test_doc_example_header_and_put_slot_decode() -> None:
    head, tail, capacity = struct.unpack("<QQQ", doc_example("header"))
    assert (head, tail, capacity) == (1, 0, 4)
    slot = doc_example("put-slot")
    assert slot[0] == 1 and slot[1] == Op.PUT
    assert codec.decode_put(slot[2:18]) == (None, 1500)
    (size,) = struct.unpack_from("<I", slot, 18)
    assert slot[22 : 22 + size] == b"hello"


def test_doc_example_responses_decode() -> None:
    raw = doc_example("put-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 20
    status, flags, _ = struct.unpack_from("<BBH", raw, 4)
    assert (status, flags) == (Status.OK, 0)
    assert codec.decode_put_ok(raw[8:]) == (1, 1_800_000_001_500)

    assert codec.decode_find(doc_example("find-key")) == codec.FindArgs(10, 0, 30_000)
    raw = doc_example("find-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 75
    assert raw[4] == Status.OK
    (delivery,) = codec.decode_deliveries(raw[8:])
    assert delivery == Delivery(
        1,
        "8f68d1e3.1.1",
        b"hello",
        1_800_000_001_500,
        ItemStats(1_800_000_000_000, 0, 1),
        1_800_000_031_600,
    )


def test_client_fills_a_slot_as_the_original_says_and_the_server_answers_in_order() -> None:
    mm, server, client = pair()
    key = codec.encode_put(None, 1500)
    index = client.submit(Op.PUT, key, b"hello")
    assert index == 0
    assert mm[:24] == doc_example("header")
    assert mm[24 : 24 + 27] == doc_example("put-slot")
    assert server.wait_for_head(0.0, 0.0) == 1
    cmd = server.read(0)
    assert (cmd.op, cmd.key, cmd.value, cmd.value_size) == (Op.PUT, key, b"hello", 5)
    assert mm[24] == 0  # the server took the command
    server.publish(0, encode_response(Status.OK, codec.encode_put_ok(1, 1_800_000_001_500)))
    server.advance()
    assert mm[24 + 1046 : 24 + 1046 + 24] == doc_example("put-response")
    assert mm[24 + 2074] == 1
    assert struct.unpack_from("<Q", mm, 8)[0] == 1
    response = client.wait(0, 1.0)
    assert (response.status, response.more) == (Status.OK, False)
    assert codec.decode_put_ok(response.body) == (1, 1_800_000_001_500)


def test_call_follows_continuations() -> None:
    _, server, client = pair()
    body = bytes(range(256)) * 9  # 2304 bytes: three chunks
    stop = threading.Event()

    def serve() -> None:
        rest = b""
        while not stop.is_set():
            head = server.wait_for_head(0.05, 0.0)
            while server.tail != head:
                cmd = server.read(server.tail)
                data = body if cmd.op == Op.FIND else rest
                chunk, rest = data[:RESPONSE_BODY_MAX], data[RESPONSE_BODY_MAX:]
                server.publish(cmd.index, encode_response(Status.OK, chunk, 1 if rest else 0))
                server.advance()

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        response = client.call(Op.FIND, codec.encode_find(1, 0, None), b"", timeout_s=10)
        assert response.body == body
        assert not response.more
    finally:
        stop.set()
        thread.join(timeout=10)


def test_client_refuses_values_that_do_not_fit_and_times_out_without_a_server() -> None:
    _, _, client = pair()
    with pytest.raises(ValueTooLargeForRing):
        client.submit(Op.PUT, bytes(16), bytes(1025))
    index = client.submit(Op.PUT, bytes(16), bytes(1024))
    with pytest.raises(RingTimeout):
        client.wait(index, 0.01)


def test_server_checks_head_and_ready_and_never_trusts_capacity_or_tail() -> None:
    mm, server, _ = pair(4)
    at.store_u64(mm, 16, 1 << 40)  # a client rewrites capacity and tail: ignored
    at.store_u64(mm, 8, 3)
    at.store_u64(mm, 0, 9)
    with pytest.raises(ProtocolError):
        server.head()
    at.store_u64(mm, 0, 1)  # head moved but slot 0 is not ready
    assert server.head() == 1 and server.tail == 0 and server.capacity == 4
    with pytest.raises(MalformedSlot):
        server.read(0)


def test_an_oversized_value_size_is_reported_not_read() -> None:
    mm, server, _ = pair()
    mm[24] = 1
    struct.pack_into("<I", mm, 24 + 18, 0xFFFFFFFF)
    cmd = server.read(0)
    assert cmd.value_size == 0xFFFFFFFF and cmd.value == b""


def test_codec_round_trips() -> None:
    assert codec.decode_put(codec.encode_put(123, None)) == (123, None)
    key, value = codec.encode_requeue(7, "r.1", None, 250)
    args = codec.decode_requeue(key, value)
    assert (args.id, args.receipt, args.arg, args.delay_ms) == (7, "r.1", None, 250)
    key, value = codec.encode_extend(8, "r.2", 5000)
    args = codec.decode_item(key, value)
    assert (args.id, args.receipt, args.arg) == (8, "r.2", 5000)
    assert codec.decode_extend_ok(codec.encode_extend_ok(99, "r.3")) == (99, "r.3")
    deliveries = [
        Delivery(i, f"rc.{i}", bytes([i]) * i, 10 + i, ItemStats(1, 2, 3), 20 + i) for i in range(5)
    ]
    assert codec.decode_deliveries(codec.encode_deliveries(deliveries)) == deliveries


@pytest.mark.parametrize(
    "body",
    [b"", b"\x01\x00\x00", b"\x01\x00\x00\x00" + bytes(49), b"\x02\x00\x00\x00" + bytes(50)],
)
def test_truncated_find_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedSlot):
        codec.decode_deliveries(body)


@pytest.mark.parametrize("receipt", [b"", b"\xff\xfe"])
def test_bad_receipts_are_malformed(receipt: bytes) -> None:
    with pytest.raises(MalformedSlot):
        codec.decode_item(bytes(16), receipt)


def test_every_storage_error_that_is_503_over_http_is_unavailable_or_its_own_status() -> None:
    """A ring answer never calls a passing fault 'internal': the replica group's
    refusals have their own statuses, other 503s answer ``unavailable``."""
    from dq.shm.command_handler import _error
    from dq.shm.command_ring import Status
    from dq.storage.errors import (
        EngineUnavailable,
        ReplicationStalled,
        ReplicationTimeout,
        WriteStall,
    )

    assert _error(ReplicationStalled("stalled"))[0] == Status.REPLICATION_STALLED
    assert Status.REPLICATION_STALLED.http_status == 503
    assert _error(ReplicationTimeout("late"))[0] == Status.REPLICATION_TIMEOUT
    assert _error(WriteStall("behind"))[0] == Status.UNAVAILABLE
    assert _error(EngineUnavailable("closed"))[0] == Status.UNAVAILABLE


class _Done:
    """What the engine answers per enqueued item (id, stored deadline, duplicate)."""

    def __init__(self, item_id: int, deadline: int, duplicate: bool = False) -> None:
        self.id, self.deadline, self.duplicate = item_id, deadline, duplicate


def test_doc_example_batch_commands_decode() -> None:
    part, last = doc_example("part-slot"), doc_example("put-many-slot")
    assert (part[0], part[1], part[2:18]) == (1, Op.PART, bytes(16))
    assert (last[0], last[1]) == (1, Op.PUT_MANY)
    (psize,) = struct.unpack_from("<I", part, 18)
    (lsize,) = struct.unpack_from("<I", last, 18)
    body = part[22 : 22 + psize] + last[22 : 22 + lsize]
    assert struct.unpack_from("<II", last, 2) == (2, len(body)) == (2, 51)
    items = codec.decode_put_many(last[2:18], body)
    assert [(i.value, i.deadline, i.delay_ms, i.key) for i in items] == [
        (b"hello", None, 1500, None),
        (b"hi", None, None, "k1"),
    ]

    raw, tail = doc_example("put-many-response"), doc_example("put-many-response-last")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 38
    assert struct.unpack_from("<BBH", raw, 4) == (Status.OK, 0, 0)
    assert codec.decode_put_many_ok(raw[8:], 2) == [
        (1, 1_800_000_001_500, False),
        (2, 1_800_000_000_000, False),
    ]
    assert tail == struct.pack("<I", 4) + bytes(4)

    slot = doc_example("delete-many-slot")
    assert (slot[0], slot[1]) == (1, Op.DELETE_MANY)
    (size,) = struct.unpack_from("<I", slot, 18)
    releases = codec.decode_delete_many(slot[2:18], slot[22 : 22 + size])
    assert [(r.id, r.receipt) for r in releases] == [(1, "8f68d1e3.1.1"), (2, "8f68d1e3.2.1")]
    raw = doc_example("delete-many-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 21 and raw[4] == Status.OK
    assert codec.decode_delete_many_ok(raw[8:], 2) == [
        (0, ""),
        (Status.STALE_RECEIPT, "stale receipt"),
    ]


def test_a_batch_command_goes_through_a_ring_as_the_doc_shows() -> None:
    """The client writes a PUT_MANY as a PART and its own slot; the server answers both
    slots together, the body in the first, the second empty, and wakes once."""
    mm, server, client = pair()
    key, body = codec.encode_put_many([(b"hello", None, 1500, None), (b"hi", None, None, "k1")])
    first = client.submit(Op.PART, bytes(16), body[:26], wake=False)
    second = client.submit(Op.PUT_MANY, key, body[26:])
    assert (first, second) == (0, 1)
    assert mm[24 : 24 + 48] == doc_example("part-slot")
    assert mm[24 + 2080 : 24 + 2080 + 47] == doc_example("put-many-slot")
    assert server.wait_for_head(0.0, 0.0) == 2
    cmds = [server.read(0), server.read(1)]
    got = codec.decode_put_many(cmds[1].key, cmds[0].value + cmds[1].value)
    assert [i.value for i in got] == [b"hello", b"hi"]
    answer = codec.encode_put_many_ok([_Done(1, 1_800_000_001_500), _Done(2, 1_800_000_000_000)])
    server.publish_span([0, 1], [encode_response(Status.OK, answer), encode_response(0, b"")])
    server.advance(2)
    assert mm[24 + 1046 : 24 + 1046 + 42] == doc_example("put-many-response")
    assert mm[24 + 2080 + 1046 : 24 + 2080 + 1046 + 8] == doc_example("put-many-response-last")
    assert struct.unpack_from("<Q", mm, 8)[0] == 2
    response = client.collect([0, 1], 1.0)
    assert (response.status, response.more, response.body) == (Status.OK, False, answer)

    key, body = codec.encode_delete_many([(1, "8f68d1e3.1.1"), (2, "8f68d1e3.2.1")])
    assert client.submit(Op.DELETE_MANY, key, body) == 2
    assert mm[24 + 2 * 2080 : 24 + 2 * 2080 + 66] == doc_example("delete-many-slot")


def test_an_answer_spread_over_a_commands_slots_is_joined_and_continued() -> None:
    """Three slots hold 3060 bytes; the 4000-byte answer ends with MORE on the last slot,
    and CONTINUE fetches the rest."""
    _, server, client = pair(8)
    body = bytes(range(200)) * 20
    indexes = [client.submit(Op.PART, bytes(16), b"", wake=False) for _ in range(2)]
    indexes.append(client.submit(Op.FIND, codec.encode_find(9, 0, None), b""))
    chunks = [body[i : i + RESPONSE_BODY_MAX] for i in range(0, 3 * RESPONSE_BODY_MAX, 1020)]
    server.wait_for_head(0.0, 0.0)
    for i in indexes:
        server.read(i)
    server.publish_span(indexes, [encode_response(Status.OK, c, 1) for c in chunks])
    server.advance(3)

    def serve_rest() -> None:
        server.wait_for_head(5.0, 0.0, 3)
        server.read(3)
        server.publish(3, encode_response(Status.OK, body[3 * RESPONSE_BODY_MAX :]))
        server.advance()

    thread = threading.Thread(target=serve_rest)
    thread.start()
    first = client.collect(indexes, 1.0)
    assert first.more and first.body == body[: 3 * RESPONSE_BODY_MAX]
    assert client.complete(first, 5.0).body == body
    thread.join(5)


def test_batch_codecs_round_trip_and_refuse_bad_bodies() -> None:
    items = [(bytes([i]) * i, 10 + i if i % 2 else None, None, f"k{i}" if i % 3 else None)
             for i in range(1, 40)]  # fmt: skip
    key, body = codec.encode_put_many(items)
    got = codec.decode_put_many(key, body)
    assert [(i.value, i.deadline, i.delay_ms, i.key) for i in got] == items
    with pytest.raises(MalformedSlot):
        codec.decode_put_many(key, body[:-1])  # body_size no longer matches
    with pytest.raises(MalformedSlot):
        codec.decode_put_many(struct.pack("<IIQ", 40, len(body), 0), body)  # one item short
    with pytest.raises(MalformedSlot):
        codec.decode_put_many(struct.pack("<IIQ", 38, len(body), 0), body)  # bytes left over
    with pytest.raises(ValueError):
        codec.encode_put_many([(b"x", None, None, "k" * 256)])
    with pytest.raises(ValueError):
        codec.encode_put_many([(b"x", None, None, "")])
    releases = [(i, f"r.{i}.1") for i in range(50)]
    key, body = codec.encode_delete_many(releases)
    assert [(r.id, r.receipt) for r in codec.decode_delete_many(key, body)] == releases
    with pytest.raises(MalformedSlot):
        codec.decode_delete_many(struct.pack("<IIQ", 51, len(body), 0), body)

    from dq.storage.types import ItemOutcome

    outcomes = [
        ItemOutcome(1),
        ItemOutcome(2, "stale_receipt", "x" * 100),
        ItemOutcome(3, "item_not_found", "gone"),
    ]
    statuses = [0, Status.STALE_RECEIPT, Status.ITEM_NOT_FOUND]
    full = codec.encode_delete_many_ok(statuses, outcomes, 1020)
    assert codec.decode_delete_many_ok(full, 3) == [(0, ""), (9, "x" * 100), (8, "gone")]
    cut = codec.encode_delete_many_ok(statuses, outcomes, 3 + 4 + 10)  # messages cut to fit
    assert len(cut) == 17
    assert codec.decode_delete_many_ok(cut, 3) == [(0, ""), (9, "x" * 10), (8, "")]
