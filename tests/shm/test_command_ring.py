"""The command ring's layout and slot protocol: docs/shm.md byte for byte, between the
client's side (``dq.shm.command_ring.ClientRing``, ``command_codec``) and the server's
compiled session (``dq.shm._session``), with a handler that records what the session
decoded and answers what the test says (``tests/shm/ring_session.py``)."""

from __future__ import annotations

import dataclasses
import struct
import threading
import time

import pytest

from dq.shm import _atomics as at
from dq.shm import command_codec as codec
from dq.shm.command_ring import FLAG_GROUPS, RESPONSE_BODY_MAX, SLOT_SIZE, Op, Status, ring_size
from dq.shm.errors import MalformedSlot, ProtocolError, RingTimeout, ValueTooLargeForRing
from dq.storage.types import Delivery, Enqueued, ItemOutcome, ItemStats
from dq.storage.waits import Leased, leased
from tests.shm.doc_examples import doc_example
from tests.shm.ring_session import WAIT_S, Served

DOC_DELIVERY = Delivery(
    1,
    "8f68d1e3.1.1",
    b"hello",
    1_800_000_001_500,
    ItemStats(1_800_000_000_000, 0, 1),
    1_800_000_031_600,
)


#: the delivery of the example with groups: the same item, in the group ``customer-42``
DOC_GROUP_DELIVERY = dataclasses.replace(DOC_DELIVERY, group="customer-42")


def response_bytes(served: Served, index: int, size: int) -> bytes:
    """``size`` bytes of slot ``index`` from ``response_size`` on (offset 1046)."""
    off = 24 + SLOT_SIZE * index + 1046
    return bytes(served.mm[off : off + size])


def write_slot(served: Served, index: int, raw: bytes) -> None:
    """Put a slot's first bytes as a client wrote them (``ready`` last), and move head."""
    off = 24 + SLOT_SIZE * index
    served.mm[off + 1 : off + len(raw)] = raw[1:]
    at.store_u8(served.mm, off, raw[0])


def test_sizes_match_the_original() -> None:
    assert SLOT_SIZE == 2080
    assert ring_size(64) == 24 + 2080 * 64 == 133_144
    assert RESPONSE_BODY_MAX == 1020
    assert [int(op) for op in (Op.PUT, Op.DELETE, Op.FIND)] == [0, 1, 2]


def test_doc_example_header_and_put_slot_decode() -> None:
    head, tail, capacity = struct.unpack("<QQQ", doc_example("header"))
    assert (head, tail, capacity) == (1, 0, 4)
    with Served(4) as served:
        write_slot(served, 0, doc_example("put-slot"))
        served.handler.answers.append([Enqueued(1, 1_800_000_001_500)])
        at.store_u64(served.mm, 0, 1)
        served.start()
        assert served.client.wait(0, WAIT_S).status == Status.OK
        assert served.handler.calls == [("enqueue_one", b"hello", None, 1500)]
        assert response_bytes(served, 0, 24) == doc_example("put-response")


def test_doc_example_responses_decode() -> None:
    raw = doc_example("put-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 20
    status, flags, _ = struct.unpack_from("<BBH", raw, 4)
    assert (status, flags) == (Status.OK, 0)
    assert codec.decode_put_ok(raw[8:]) == (1, 1_800_000_001_500)

    raw = doc_example("find-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 75
    assert raw[4] == Status.OK
    (delivery,) = codec.decode_deliveries(raw[8:])
    assert delivery == DOC_DELIVERY

    with Served(4) as served:  # the server decodes the key and encodes that answer
        served.handler.answers.append(Leased([DOC_DELIVERY]))
        served.start()
        index = served.client.submit(Op.FIND, doc_example("find-key"), b"")
        served.client.wait(index, WAIT_S)
        assert served.handler.calls == [("find", 10, 0, 30_000)]
        assert response_bytes(served, index, len(raw)) == raw

        served.handler.answers.append(leased([], False, False))
        index = served.client.submit(Op.FIND, codec.encode_find(1, 0, None), b"")
        served.client.wait(index, WAIT_S)
        assert response_bytes(served, index, 12) == doc_example("find-no-queue-response")


def test_doc_example_with_groups_decodes_and_the_older_layout_stays() -> None:
    """A ring whose client asked for groups answers the document's bytes with GROUPS set;
    the answer without groups (an older client's) is byte for byte what it always was,
    and a decoder reads each by its answer's flag."""
    raw = doc_example("find-groups-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 87
    assert (raw[4], raw[5]) == (Status.OK, FLAG_GROUPS)
    (delivery,) = codec.decode_deliveries(raw[8:], raw[5])
    assert delivery == DOC_GROUP_DELIVERY
    old = doc_example("find-response")
    assert old[5] == 0
    assert codec.decode_deliveries(old[8:], old[5]) == [DOC_DELIVERY]  # group None

    for groups, wanted in ((True, raw), (False, old)):
        with Served(4, groups=groups) as served:
            served.handler.answers.append(Leased([DOC_GROUP_DELIVERY]))
            served.start()
            index = served.client.submit(Op.FIND, doc_example("find-key"), b"")
            served.client.wait(index, WAIT_S)
            assert response_bytes(served, index, len(wanted)) == wanted


def test_client_fills_a_slot_as_the_original_says_and_the_server_answers_in_order() -> None:
    with Served(4) as served:
        mm, client = served.mm, served.client
        key = codec.encode_put(None, 1500)
        index = client.submit(Op.PUT, key, b"hello")
        assert index == 0
        assert mm[:24] == doc_example("header")
        assert mm[24 : 24 + 27] == doc_example("put-slot")
        served.handler.answers.append([Enqueued(1, 1_800_000_001_500)])
        served.start()
        response = client.wait(0, WAIT_S)
        assert mm[24] == 0  # the server took the command
        assert mm[24 + 1046 : 24 + 1046 + 24] == doc_example("put-response")
        assert mm[24 + 2074] == 1
        assert struct.unpack_from("<Q", mm, 8)[0] == 1
        assert (response.status, response.more) == (Status.OK, False)
        assert codec.decode_put_ok(response.body) == (1, 1_800_000_001_500)


def test_exchange_writes_the_slot_as_the_original_says_and_returns_its_answer() -> None:
    """``exchange`` (the one-item calls' round trip) fills the slot byte for byte as
    ``submit`` does and reads the answer as ``wait`` does, as a plain triple."""
    with Served(4) as served:
        mm = served.mm
        served.handler.answers.append([Enqueued(1, 1_800_000_001_500)])
        served.start()
        status, flags, body = served.client.exchange(
            Op.PUT, codec.encode_put(None, 1500), b"hello", WAIT_S
        )
        assert mm[:8] == doc_example("header")[:8]  # head moved past slot 0
        assert mm[25 : 24 + 27] == doc_example("put-slot")[1:]  # ready: the server took it
        assert mm[24 + 1046 : 24 + 1046 + 24] == doc_example("put-response")
        assert (status, flags) == (Status.OK, 0)
        assert codec.decode_put_ok(body) == (1, 1_800_000_001_500)


def test_exchange_follows_continuations_and_refuses_what_breaks_the_protocol() -> None:
    deliveries = _deliveries([700, 700, 700])  # ~2.3 KB: three chunks
    with Served(4) as served:
        served.handler.answers.append(Leased(deliveries))
        served.start()
        status, flags, body = served.client.exchange(
            Op.FIND, codec.encode_find(3, 0, None), b"", WAIT_S
        )
        assert (status, flags) == (Status.OK, 0)
        assert codec.decode_deliveries(body) == deliveries
    with Served(4) as served:  # a head only a scribbling server could have written
        at.store_u64(served.mm, 0, 9)
        with pytest.raises(ProtocolError, match="head out of range"):
            served.client.exchange(Op.STATS, bytes(16), b"", WAIT_S)
    with Served(4) as served:  # an answer's size beyond its slot: refused, not read
        mm = served.mm

        def answer_badly() -> None:
            for _ in range(10_000):
                if at.load_u64(mm, 0) == 1:
                    struct.pack_into("<I", mm, 24 + 1046, 5000)
                    at.store_u8(mm, 24 + 2074, 1)
                    at.futex_wake(mm, 24 + 2072)
                    return
                time.sleep(0.001)

        writer = threading.Thread(target=answer_badly)
        writer.start()
        with pytest.raises(ProtocolError, match="response_size out of range"):
            served.client.exchange(Op.STATS, bytes(16), b"", WAIT_S)
        writer.join(WAIT_S)


def test_exchange_times_out_without_a_server() -> None:
    with Served(4) as served, pytest.raises(RingTimeout):
        served.client.exchange(Op.STATS, bytes(16), b"", 0.05)


def _deliveries(sizes: list[int]) -> list[Delivery]:
    return [
        Delivery(i, f"rc.{i}", bytes([i % 256]) * size, 10 + i, ItemStats(1, 2, 3), 20 + i)
        for i, size in enumerate(sizes)
    ]


def test_call_follows_continuations() -> None:
    deliveries = _deliveries([700, 700, 700])  # ~2.3 KB: three chunks
    with Served(4) as served:
        served.handler.answers.append(Leased(deliveries))
        served.start()
        response = served.client.call(Op.FIND, codec.encode_find(3, 0, None), b"", timeout_s=10)
        assert codec.decode_deliveries(response.body) == deliveries
        assert len(response.body) > 2 * RESPONSE_BODY_MAX
        assert not response.more
        # nothing continues any more
        again = served.client.call(Op.CONTINUE, bytes(16), b"", timeout_s=10)
        assert again.status == Status.NO_CONTINUATION


def test_client_refuses_values_that_do_not_fit_and_times_out_without_a_server() -> None:
    with Served(4) as served:
        with pytest.raises(ValueTooLargeForRing):
            served.client.submit(Op.PUT, bytes(16), bytes(1025))
        index = served.client.submit(Op.PUT, bytes(16), bytes(1024))
        with pytest.raises(RingTimeout):
            served.client.wait(index, 0.01)


def test_server_checks_head_and_ready_and_never_trusts_capacity_or_tail() -> None:
    with Served(4) as served:
        mm = served.mm
        at.store_u64(mm, 16, 1 << 40)  # a client rewrites capacity and tail: ignored
        at.store_u64(mm, 8, 3)
        at.store_u64(mm, 0, 9)
        served.start()
        at.futex_wake(mm, 0)
        served.join()
        assert isinstance(served.failure, ProtocolError)
        assert "head beyond capacity" in str(served.failure)
    with Served(4) as served:
        at.store_u64(served.mm, 16, 1 << 40)
        at.store_u64(served.mm, 0, 1)  # head moved but slot 0 is not ready
        served.start()
        served.join()
        assert isinstance(served.failure, MalformedSlot)
        assert str(served.failure) == "head moved past a slot that is not ready (slot=0)"
        assert served.handler.calls == []


def test_an_oversized_value_size_is_reported_not_read() -> None:
    with Served(4) as served:
        served.mm[24 + 1] = Op.PUT
        struct.pack_into("<I", served.mm, 24 + 18, 0xFFFFFFFF)
        served.mm[24] = 1
        at.store_u64(served.mm, 0, 1)
        served.start()
        response = served.client.wait(0, WAIT_S)
        assert (response.status, response.body) == (
            Status.VALUE_TOO_LARGE,
            b"value_size exceeds the 1024-byte slot",
        )
        assert served.handler.calls == []


def test_codec_round_trips() -> None:
    """What a client encodes, the session decodes into the handler's arguments; what the
    session encodes, the client decodes."""
    deliveries = _deliveries([0, 1, 2, 3, 4])
    with Served(8) as served:
        served.start()
        call = served.client.call
        assert call(Op.PUT, codec.encode_put(123, None), b"v").status == Status.OK
        key, value = codec.encode_requeue(7, "r.1", None, 250)
        requeued = call(Op.REQUEUE, key, value)
        assert codec.decode_u64(requeued.body) == 5
        served.handler.answers.append([ItemOutcome(8, receipt="r.3", lease_expires=99)])
        extended = call(Op.EXTEND, *codec.encode_extend(8, "r.2", 5000))
        assert codec.decode_extend_ok(extended.body) == (99, "r.3")
        served.handler.answers.append(Leased(deliveries))
        found = call(Op.FIND, codec.encode_find(0, 250, 4000), b"")
        assert codec.decode_deliveries(found.body) == deliveries
        assert served.handler.calls == [
            ("enqueue_one", b"v", 123, None),
            ("requeue", 7, "r.1", None, 250),
            ("extend", 8, "r.2", 5000),
            ("find", 1, 250, 4000),  # count 0 means 1
        ]


@pytest.mark.parametrize(
    "body",
    [b"", b"\x01\x00\x00", b"\x01\x00\x00\x00" + bytes(49), b"\x02\x00\x00\x00" + bytes(50)],
)
def test_truncated_find_bodies_are_malformed(body: bytes) -> None:
    with pytest.raises(MalformedSlot):
        codec.decode_deliveries(body)


@pytest.mark.parametrize(
    ("receipt", "why"), [(b"", "receipt is empty"), (b"\xff\xfe", "receipt is not ASCII")]
)
def test_bad_receipts_are_malformed(receipt: bytes, why: str) -> None:
    with Served(4) as served:
        served.start()
        for op in (Op.DELETE, Op.EXTEND):
            response = served.client.call(op, codec.encode_item(1, "x", 5)[0], receipt)
            assert (response.status, response.body) == (Status.MALFORMED, why.encode())
        key, value = codec.encode_requeue(1, "x", None, 5)
        response = served.client.call(Op.REQUEUE, key, value[:8] + receipt)
        assert (response.status, response.body) == (Status.MALFORMED, why.encode())
        assert served.handler.calls == []


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


def test_doc_example_batch_commands_decode() -> None:
    part, last = doc_example("part-slot"), doc_example("put-many-slot")
    assert (part[0], part[1], part[2:18]) == (1, Op.PART, bytes(16))
    assert (last[0], last[1]) == (1, Op.PUT_MANY)
    (psize,) = struct.unpack_from("<I", part, 18)
    (lsize,) = struct.unpack_from("<I", last, 18)
    assert struct.unpack_from("<II", last, 2) == (2, psize + lsize) == (2, 51)

    raw, tail = doc_example("put-many-response"), doc_example("put-many-response-last")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 38
    assert struct.unpack_from("<BBH", raw, 4) == (Status.OK, 0, 0)
    assert codec.decode_put_many_ok(raw[8:], 2) == [
        (1, 1_800_000_001_500, False, False),
        (2, 1_800_000_000_000, False, False),
    ]
    assert tail == struct.pack("<I", 4) + bytes(4)

    slot = doc_example("delete-many-slot")
    assert (slot[0], slot[1]) == (1, Op.DELETE_MANY)
    raw = doc_example("delete-many-response")
    (size,) = struct.unpack_from("<I", raw)
    assert size == len(raw) - 4 == 21 and raw[4] == Status.OK
    assert codec.decode_delete_many_ok(raw[8:], 2) == [
        (0, ""),
        (Status.STALE_RECEIPT, "stale receipt"),
    ]


def test_a_batch_command_goes_through_a_ring_as_the_doc_shows() -> None:
    """The client writes a PUT_MANY as a PART and its own slot; the server decodes the
    body the two carry and answers both slots together, the body in the first, the second
    empty; then a DELETE_MANY in one slot."""
    with Served(4) as served:
        mm, client = served.mm, served.client
        key, body = codec.encode_put_many([(b"hello", None, 1500, None), (b"hi", None, None, "k1")])
        first = client.submit(Op.PART, bytes(16), body[:26], wake=False)
        second = client.submit(Op.PUT_MANY, key, body[26:])
        assert (first, second) == (0, 1)
        assert mm[24 : 24 + 48] == doc_example("part-slot")
        assert mm[24 + 2080 : 24 + 2080 + 47] == doc_example("put-many-slot")
        served.handler.answers.append(
            [Enqueued(1, 1_800_000_001_500), Enqueued(2, 1_800_000_000_000)]
        )
        served.start()
        response = client.collect([0, 1], WAIT_S)
        assert served.handler.calls == [
            ("put_many", [(b"hello", None, 1500, None), (b"hi", None, None, "k1")])
        ]
        assert mm[24 + 1046 : 24 + 1046 + 42] == doc_example("put-many-response")
        assert mm[24 + 2080 + 1046 : 24 + 2080 + 1046 + 8] == doc_example("put-many-response-last")
        assert struct.unpack_from("<Q", mm, 8)[0] == 2
        assert (response.status, response.more) == (Status.OK, False)

        key, body = codec.encode_delete_many([(1, "8f68d1e3.1.1"), (2, "8f68d1e3.2.1")])
        served.handler.answers.append(
            [ItemOutcome(1), ItemOutcome(2, "stale_receipt", "stale receipt")]
        )
        index = client.submit(Op.DELETE_MANY, key, body, wake=False)
        assert index == 2
        assert mm[24 + 2 * 2080 : 24 + 2 * 2080 + 66] == doc_example("delete-many-slot")
        client.wake_server()
        client.wait(index, WAIT_S)
        assert served.handler.calls[-1] == (
            "delete_many",
            [(1, "8f68d1e3.1.1"), (2, "8f68d1e3.2.1")],
        )
        raw = doc_example("delete-many-response")
        assert response_bytes(served, index, len(raw)) == raw


def test_a_replacing_batch_goes_through_a_ring_as_the_doc_shows() -> None:
    """A PUT_MANY with the REPLACE flag reaches the handler as a replacing batch, and a
    replaced item is answered ``how`` 2; a flag the document does not define is refused
    as malformed and nothing reaches the handler."""
    slot = doc_example("put-many-replace-slot")
    assert (slot[0], slot[1]) == (1, Op.PUT_MANY)
    assert struct.unpack_from("<IIQI", slot, 2) == (1, 30, codec.PUT_MANY_REPLACE, 30)
    raw = doc_example("put-many-replace-response")
    assert struct.unpack_from("<IBBH", raw) == (21, Status.OK, 0, 0)
    assert codec.decode_put_many_ok(raw[8:], 1) == [(7, 1_800_000_300_000, False, True)]
    with Served(4) as served:
        mm, client = served.mm, served.client
        key, body = codec.encode_put_many([(b"digest 2", None, 300_000, "d")], replace=True)
        index = client.submit(Op.PUT_MANY, key, body, wake=False)
        assert mm[24 + 2080 * index : 24 + 2080 * index + 52] == slot
        served.handler.answers.append([Enqueued(7, 1_800_000_300_000, replaced=True)])
        served.start()
        client.wake_server()
        client.wait(index, WAIT_S)
        assert served.handler.calls == [("put_many", [(b"digest 2", None, 300_000, "d")], True)]
        assert response_bytes(served, index, len(raw)) == raw

        unknown = struct.pack("<IIQ", 1, len(body), 2)
        index = client.submit(Op.PUT_MANY, unknown, body, wake=False)
        client.wake_server()
        client.wait(index, WAIT_S)
        answer = response_bytes(served, index, 8 + 45)
        assert answer[4] == Status.MALFORMED and b"unknown bits" in answer[8:], answer
        assert len(served.handler.calls) == 1


def test_an_answer_spread_over_a_commands_slots_is_joined_and_continued() -> None:
    """Three slots hold 3060 bytes; a 4000-byte answer ends with MORE on the last slot,
    and CONTINUE fetches the rest."""
    deliveries = _deliveries([930, 930, 930, 930])  # 4 + 4 x (50 + 4 + 930) = 3940 bytes
    with Served(8) as served:
        client = served.client
        served.handler.answers.append(Leased(deliveries))
        indexes = [client.submit(Op.PART, bytes(16), b"", wake=False) for _ in range(2)]
        indexes.append(client.submit(Op.FIND, codec.encode_find(9, 0, None), b""))
        served.start()
        first = client.collect(indexes, WAIT_S)
        assert first.more and len(first.body) == 3 * RESPONSE_BODY_MAX
        whole = client.complete(first, WAIT_S)
        assert codec.decode_deliveries(whole.body) == deliveries
        assert not whole.more


def test_batch_bodies_round_trip_and_bad_ones_are_refused() -> None:
    items = [(bytes([i]) * i, 10 + i if i % 2 else None, None, f"k{i}" if i % 3 else None)
             for i in range(1, 40)]  # fmt: skip
    key, body = codec.encode_put_many(items)
    bad_key = body[:21] + bytes([2]) + body[22:]  # a key length that eats the value
    releases = [(i, f"r.{i}.1") for i in range(50)]
    dkey, dbody = codec.encode_delete_many(releases)
    with Served(64) as served:
        served.start()

        def many(op: int, key: bytes, body: bytes) -> tuple[int, bytes]:
            spans = [body[i : i + 1024] for i in range(0, len(body), 1024)] or [b""]
            slots = [(Op.PART, bytes(16), piece) for piece in spans[:-1]]
            indexes = served.client.submit_span([*slots, (op, key, spans[-1])])
            served.client.wake_server()
            got = served.client.collect(indexes, WAIT_S)
            return got.status, got.body

        assert many(Op.PUT_MANY, key, body)[0] == Status.OK
        assert served.handler.calls.pop() == ("put_many", items)
        assert many(Op.PUT_MANY, key, body[:-1]) == (
            Status.MALFORMED,
            f"body_size does not match the body sent (size={len(body)}, got={len(body) - 1})".encode(),
        )
        short = struct.pack("<IIQ", 40, len(body), 0)
        assert many(Op.PUT_MANY, short, body) == (
            Status.MALFORMED,
            f"PUT_MANY body truncated (offset={len(body)})".encode(),
        )
        over = struct.pack("<IIQ", 38, len(body), 0)
        status, text = many(Op.PUT_MANY, over, body)
        assert status == Status.MALFORMED and text.startswith(
            b"PUT_MANY body longer than its items"
        )
        status, text = many(
            Op.PUT_MANY, struct.pack("<IIQ", 1, 25, 0), bytes(21) + b"\xff\xfe\x00\x00"
        )
        assert (status, text) == (
            Status.MALFORMED,
            b"PUT_MANY body longer than its items (size=25, used=21)",
        )
        utf = struct.pack("<QQIB", 0, 0, 0, 2) + b"\xff\xfe"
        assert many(Op.PUT_MANY, struct.pack("<IIQ", 1, len(utf), 0), utf) == (
            Status.MALFORMED,
            b"key is not UTF-8 (offset=21)",
        )
        assert many(Op.PUT_MANY, struct.pack("<IIQ", 1, len(bad_key), 0), bad_key)[0] == (
            Status.MALFORMED
        )
        assert many(Op.DELETE_MANY, dkey, dbody)[0] == Status.OK
        assert served.handler.calls.pop() == ("delete_many", releases)
        assert many(Op.DELETE_MANY, struct.pack("<IIQ", 51, len(dbody), 0), dbody) == (
            Status.MALFORMED,
            f"DELETE_MANY body truncated (offset={len(dbody)})".encode(),
        )
        assert served.handler.calls == []

        served.handler.answers.append(
            [
                ItemOutcome(1),
                ItemOutcome(2, "stale_receipt", "x" * 600),
                ItemOutcome(3, "item_not_found", "y" * 600),
            ]
        )
        three = [(1, "r.1"), (2, "r.2"), (3, "r.3")]
        status, text = many(Op.DELETE_MANY, *codec.encode_delete_many(three))
        assert status == Status.OK  # messages cut, the later ones first, to fit one slot
        assert codec.decode_delete_many_ok(text, 3) == [(0, ""), (9, "x" * 600), (8, "y" * 413)]
    with pytest.raises(ValueError):
        codec.encode_put_many([(b"x", None, None, "k" * 256)])
    with pytest.raises(ValueError):
        codec.encode_put_many([(b"x", None, None, "")])
