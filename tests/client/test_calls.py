"""Each ``Client``/``AsyncClient`` method is one ``Call`` (``client/_calls.py``): the HTTP
request it makes (``docs/http.md``), whether it may be resent, and how the answer turns
into what the method returns. A transport that answers every call from a script stands
in for the server: the clients reach it through its one method, ``call``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dq.client import (
    AsyncClient,
    BackupResult,
    BadRequest,
    BrowsePage,
    Client,
    Enqueued,
    Extend,
    Fail,
    Item,
    ItemStats,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
    Release,
    Requeue,
    RetryPolicy,
    StaleReceipt,
)
from dq.client._calls import (
    Call,
    EnqueueMany,
    EnqueueOne,
    ExtendMany,
    FailMany,
    ItemBatch,
    ReleaseMany,
    ReleaseOne,
    Request,
    RequeueMany,
)
from dq.client._http import _json_bytes
from dq.client._transport import AsyncTransport, Transport

STATS = {
    "pending": 1,
    "due": 1,
    "delayed": 0,
    "leased": 0,
    "segments": 1,
    "bytes_on_disk": 10,
    "next_id": 2,
}
CONFIG = {"default_lease_ms": 30_000, "max_deliveries": None, "dead_letter_queue": None}
QUEUE = {"name": "q", "config": CONFIG, "stats": STATS}
ITEM = {
    "id": 4,
    "receipt": "4.r",
    "value": "aGk=",
    "encoding": "base64",
    "deadline": 9,
    "stats": {"enqueue_time": 1, "requeue_time": 2, "dequeue_count": 1},
    "lease_expires": 99,
}
DELIVERED = Item(4, "4.r", b"hi", 9, ItemStats(1, 2, 1), 99)
OK = {"results": [{"id": 4, "ok": True}]}


def _info(paused: bool = False) -> QueueInfo:
    return Client("http://x", transport=_Scripted(QUEUE if not paused else _paused())).queue("q")


def _paused() -> dict[str, Any]:
    return {**QUEUE, "stats": {**STATS, "paused": True}}


# method, args, kwargs; the call: class, HTTP method, path, query, body, idempotent;
# the server's answer; what the method returns
CASES: list[tuple[Any, ...]] = [
    ("enqueue", ("q", b"v"), {"delay_ms": 5}, "EnqueueOne", "POST", "/v1/queues/q/items", None,
     {"items": [{"value": "v", "encoding": "utf-8", "delay_ms": 5}]}, False,
     {"items": [{"id": 7, "deadline": 10}]}, 7),
    ("enqueue", ("q", "é"), {"deadline": 3, "key": "k"}, "EnqueueOne", "POST",
     "/v1/queues/q/items", None,
     {"items": [{"value": "é", "encoding": "utf-8", "deadline": 3, "key": "k"}]}, True,
     {"items": [{"id": 8, "deadline": 3}]}, 8),
    ("enqueue_many", ("q", [b"\xff", NewItem(b"b", key="k")]), {}, "EnqueueMany", "POST",
     "/v1/queues/q/items", None,
     {"items": [{"value": "/w==", "encoding": "base64"},
                {"value": "b", "encoding": "utf-8", "key": "k"}]}, False,
     {"items": [{"id": 1, "deadline": 5}, {"id": 2, "deadline": 5, "duplicate": True}]},
     [Enqueued(1, 5), Enqueued(2, 5, True)]),
    ("enqueue_many", ("q", [NewItem(b"a", key="1"), NewItem(b"b", key="2")]), {},
     "EnqueueMany", "POST", "/v1/queues/q/items", None,
     {"items": [{"value": "a", "encoding": "utf-8", "key": "1"},
                {"value": "b", "encoding": "utf-8", "key": "2"}]}, True,
     {"items": [{"id": 1, "deadline": 5}, {"id": 2, "deadline": 5}]},
     [Enqueued(1, 5), Enqueued(2, 5)]),
    ("dequeue", ("q", 2, 1_000, 500), {"release": [Release(3, "3.r")]}, "Dequeue", "POST",
     "/v1/queues/q/dequeue", None,
     {"count": 2, "wait_ms": 500, "lease_ms": 1_000, "release": [{"id": 3, "receipt": "3.r"}]},
     False, {"items": [ITEM], "released": [{"id": 3, "ok": True}]}, [DELIVERED]),
    ("release", ("q", 4, "4.r"), {}, "ReleaseOne", "POST", "/v1/queues/q/release", None,
     {"items": [{"id": 4, "receipt": "4.r"}]}, False, OK, None),
    ("release_many", ("q", [DELIVERED, Release(5, "5.r")]), {}, "ReleaseMany", "POST",
     "/v1/queues/q/release", None,
     {"items": [{"id": 4, "receipt": "4.r"}, {"id": 5, "receipt": "5.r"}]}, False,
     {"results": [{"id": 4, "ok": True}, {"id": 5, "ok": False, "error": "stale_receipt"}]},
     [Outcome(4, True), Outcome(5, False, "stale_receipt")]),
    ("requeue", ("q", 4, "4.r"), {"delay_ms": 60}, "RequeueMany", "POST",
     "/v1/queues/q/requeue", None, {"items": [{"id": 4, "receipt": "4.r", "delay_ms": 60}]},
     False, {"results": [{"id": 4, "ok": True, "deadline": 77}]}, 77),
    ("requeue_many", ("q", [Requeue(4, "4.r", deadline=8)]), {}, "RequeueMany", "POST",
     "/v1/queues/q/requeue", None, {"items": [{"id": 4, "receipt": "4.r", "deadline": 8}]},
     False, {"results": [{"id": 4, "ok": True, "deadline": 8}]},
     [Outcome(4, True, deadline=8)]),
    ("extend", ("q", 4, "4.r", 9_000), {}, "ExtendMany", "POST", "/v1/queues/q/extend", None,
     {"items": [{"id": 4, "receipt": "4.r", "lease_ms": 9_000}]}, False,
     {"results": [{"id": 4, "ok": True, "receipt": "4.s", "lease_expires": 50}]},
     Outcome(4, True, receipt="4.s", lease_expires=50)),
    ("extend_many", ("q", [Extend(4, "4.r", 9_000)]), {}, "ExtendMany", "POST",
     "/v1/queues/q/extend", None, {"items": [{"id": 4, "receipt": "4.r", "lease_ms": 9_000}]},
     False, OK, [Outcome(4, True)]),
    ("queues", (), {}, "ListQueues", "GET", "/v1/queues", None, None, True,
     {"queues": [QUEUE]}, "info-list"),
    ("queue", ("q",), {}, "GetQueue", "GET", "/v1/queues/q", None, None, True, QUEUE, "info"),
    ("put_queue", ("q", QueueConfig(default_lease_ms=5, dedup_window_ms=7)), {}, "PutQueue",
     "PUT", "/v1/queues/q", None,
     {"default_lease_ms": 5, "max_deliveries": None, "dead_letter_queue": None,
      "dedup_window_ms": 7}, True, QUEUE, "info"),
    ("put_queue", ("q", QueueConfig(retry=RetryPolicy(delays_ms=(10, 20)))), {}, "PutQueue",
     "PUT", "/v1/queues/q", None,
     {"default_lease_ms": 30_000, "max_deliveries": None, "dead_letter_queue": None,
      "dedup_window_ms": 300_000, "retry": {"delays_ms": [10, 20]}}, True, QUEUE, "info"),
    ("fail", ("q", 4, "4.r", "KeyError: 'x'"), {}, "FailMany", "POST", "/v1/queues/q/fail",
     None, {"items": [{"id": 4, "receipt": "4.r", "error": "KeyError: 'x'"}]}, False,
     {"results": [{"id": 4, "ok": True, "deadline": 90}]}, 90),
    ("fail_many", ("q", [Fail(4, "4.r", "no")]), {}, "FailMany", "POST", "/v1/queues/q/fail",
     None, {"items": [{"id": 4, "receipt": "4.r", "error": "no"}]}, False, OK,
     [Outcome(4, True)]),
    ("delete_queue", ("q",), {}, "DeleteQueue", "DELETE", "/v1/queues/q", None, None, False,
     None, None),
    ("health", (), {}, "Health", "GET", "/healthz", None, None, True, {"status": "ok"},
     {"status": "ok"}),
    ("pause", ("q",), {}, "Pause", "POST", "/v1/queues/q/pause", None, None, True,
     _paused(), "paused"),
    ("resume", ("q",), {}, "Pause", "POST", "/v1/queues/q/resume", None, None, True, QUEUE,
     "info"),
    ("browse", ("q",), {"state": "due", "after": "9.4", "limit": 2, "values": True}, "Browse",
     "GET", "/v1/queues/q/items",
     {"state": "due", "limit": 2, "after": "9.4", "values": "true"}, None, True,
     {"items": [], "next": None}, BrowsePage([], None)),
    ("peek", ("q", 4), {"values": False}, "Peek", "GET", "/v1/queues/q/items/4",
     {"values": "false"}, None, True, {"id": 4, "state": "gone"}, "gone"),
    ("purge", ("q",), {}, "Purge", "DELETE", "/v1/queues/q/items", None, None, False,
     {"purged": 3}, 3),
    ("peek_key", ("q", "user/4"), {"values": False}, "PeekKey", "GET",
     "/v1/queues/q/keys/user%2F4", {"values": "false"}, None, True,
     {"id": 4, "state": "gone", "key": "user/4"}, "gone"),
    ("cancel_key", ("q", "order-7"), {}, "CancelKey", "DELETE", "/v1/queues/q/keys/order-7",
     None, None, False, {"cancelled": 9, "key": "order-7"}, 9),
    ("patch_key", ("q", "k"), {"delay_ms": 5, "value": b"\xff"}, "PatchKey", "PATCH",
     "/v1/queues/q/keys/k", None, {"delay_ms": 5, "value": "/w==", "encoding": "base64"},
     False, {"id": 3, "deadline": 50, "key": "k"}, Enqueued(3, 50)),
    ("enqueue", ("q", b"v"), {"key": "k", "on_duplicate": "replace"}, "EnqueueMany", "POST",
     "/v1/queues/q/items", None,
     {"items": [{"value": "v", "encoding": "utf-8", "key": "k", "on_duplicate": "replace"}]},
     True, {"items": [{"id": 8, "deadline": 3, "replaced": True}]}, 8),
    ("delete_item", ("q", 4), {}, "DeleteItem", "DELETE", "/v1/queues/q/items/4", None, None,
     False, None, None),
    ("redrive", ("q",), {"to": "r", "ids": (1, 2), "limit": 5}, "Redrive", "POST",
     "/v1/queues/q/redrive", None, {"to": "r", "ids": [1, 2], "limit": 5}, False,
     {"moved": 2, "to": ["r"], "failed": []}, RedriveResult(2, ["r"], [])),
    ("backup", ("b1",), {}, "Backup", "POST", "/v1/backup", None, {"dest": "b1"}, False,
     {"path": "/backups/b1", "bytes": 10, "files": 2}, BackupResult("/backups/b1", 10, 2)),
]  # fmt: skip


class _Scripted:
    """A transport answering every call with ``answer``, as the server would have."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.calls: list[Call[Any]] = []

    def call(self, call: Call[Any]) -> Any:
        self.calls.append(call)
        return call.decode(self.answer)

    def close(self) -> None:
        pass


class _AsyncScripted(_Scripted):
    async def call(self, call: Call[Any]) -> Any:  # type: ignore[override]
        return super().call(call)

    async def close(self) -> None:  # type: ignore[override]
        pass


def _expected(value: Any) -> Any:
    if value == "info":
        return _info()
    if value == "paused":
        return _info(paused=True)
    if value == "info-list":
        return [_info()]
    return value


def _check(result: Any, expected: Any) -> None:
    if expected == "gone":
        assert (result.id, result.state) == (4, "gone")
    else:
        assert result == _expected(expected)


def test_the_scripted_transports_are_transports() -> None:
    assert isinstance(_Scripted(None), Transport)
    assert isinstance(_AsyncScripted(None), AsyncTransport)


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_method_is_one_call_of_the_http_api(case: tuple[Any, ...]) -> None:
    name, args, kwargs, kind, method, path, params, body, idempotent, answer, returns = case
    sync, asynchronous = _Scripted(answer), _AsyncScripted(answer)
    _check(getattr(Client("http://x", transport=sync), name)(*args, **kwargs), returns)

    async def run() -> Any:
        return await getattr(AsyncClient("http://x", transport=asynchronous), name)(*args, **kwargs)

    _check(asyncio.run(run()), returns)
    for transport in (sync, asynchronous):
        (call,) = transport.calls
        assert type(call).__name__ == kind
        assert (call.method, call.path, call.params) == (method, path, params)
        sent = _json_bytes(call.json())
        assert (None if sent is None else json.loads(sent)) == body
        assert call.idempotent is idempotent
        assert call.queue == (args[0] if path.startswith("/v1/queues/") else None)


def test_a_long_poll_may_answer_its_wait_later_than_the_timeout() -> None:
    sync = _Scripted({"items": []})
    Client("http://x", transport=sync).dequeue("q", wait_ms=2_500)
    Client("http://x", transport=sync).dequeue("q")
    assert [c.wait_ms for c in sync.calls] == [2_500, 0]
    assert Request("GET", "/x").wait_ms == 0


def test_a_plain_request_answers_its_json_as_it_came() -> None:
    """The consumer-group client's calls (``client/groups.py``)."""
    call = Request("POST", "/v1/queues/q/consumers/c/pull", {"max": 5}, idempotent=True)
    assert (call.method, call.json(), call.idempotent, call.queue) == (
        "POST",
        {"max": 5},
        True,
        None,
    )
    assert call.decode({"start": 1}) == {"start": 1}


def test_a_failed_single_item_call_raises_the_items_error() -> None:
    failed = {"results": [{"id": 4, "ok": False, "error": "stale_receipt", "message": "late"}]}
    dq = Client("http://x", transport=_Scripted(failed))
    for call in (
        lambda: dq.release("q", 4, "4.r"),
        lambda: dq.requeue("q", 4, "4.r"),
        lambda: dq.extend("q", 4, "4.r", 10),
    ):
        with pytest.raises(StaleReceipt) as err:
            call()
        assert (err.value.queue, err.value.id) == ("q", 4)
    with pytest.raises(StaleReceipt):
        ReleaseOne("q", 4, "4.r").decode(failed)
    assert ReleaseMany("q", [Release(4, "4.r")]).decode(failed)[0].error == "stale_receipt"


def test_what_no_request_can_carry_is_refused_before_anything_is_sent() -> None:
    sync = _Scripted(None)
    dq = Client("http://x", transport=sync)
    for call in (
        lambda: dq.enqueue("a/b", b"x"),
        lambda: dq.dequeue(""),
        lambda: dq.release_many("a/b", [Release(1, "r")]),
        lambda: dq.delete_queue("q/items"),
    ):
        with pytest.raises(BadRequest) as err:
            call()
        assert err.value.code == "invalid_queue_name"
    with pytest.raises(TypeError, match="bytes or str, not int"):
        dq.enqueue("q", 12)  # type: ignore[arg-type]
    assert sync.calls == []
    assert EnqueueOne("q", bytearray(b"ab"), None, None, None).value == b"ab"  # type: ignore[arg-type]


def test_only_an_enqueue_whose_items_all_carry_a_key_may_be_resent() -> None:
    keyed, plain = NewItem(b"a", key="k"), NewItem(b"b")
    assert EnqueueMany("q", [keyed, keyed]).idempotent
    assert not EnqueueMany("q", [keyed, plain]).idempotent
    assert not EnqueueMany("q", []).idempotent
    assert EnqueueOne("q", b"a", None, None, "k").idempotent
    assert not EnqueueOne("q", b"a", None, None, None).idempotent


def test_part_of_a_batch_is_the_same_call_for_those_items() -> None:
    calls: list[ItemBatch[Any]] = [
        ReleaseMany("q", [Release(1, "a"), Release(2, "b")]),
        RequeueMany("q", [Requeue(1, "a"), Requeue(2, "b")]),
        FailMany("q", [Fail(1, "a", "x"), Fail(2, "b", "y")]),
        ExtendMany("q", [Extend(1, "a", 5), Extend(2, "b", 5)]),
    ]
    for call in calls:
        part = call.part(call.batch[1:])
        assert type(part) is type(call)
        assert (part.path, part.queue, list(part.batch)) == (call.path, "q", [call.batch[1]])


def test_odd_values_are_sent_as_the_json_encoder_writes_them() -> None:
    """A value of an ``int`` subclass (a bool, an IntEnum) takes the encoder's way; the
    request is still the one the plain types make, or JSON's own refusal."""
    call = EnqueueOne("q", b"v", True, None, None)  # type: ignore[arg-type]
    assert json.loads(_json_bytes(call.json()) or b"") == {
        "items": [{"value": "v", "encoding": "utf-8", "deadline": True}]
    }
    with pytest.raises(TypeError):
        _json_bytes(ReleaseMany("q", [Release(1, object())]).json())  # type: ignore[arg-type]
