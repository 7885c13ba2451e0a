"""The fast path answers byte for byte what the FastAPI routes answer.

Two live servers with the same settings, one with the fast path (the default) and one
with ``DQ_FAST_PATH=0``, get the same sequence of raw HTTP/1.1 requests on fresh data
directories; their raw responses must be equal once the parts that depend on the clock
or the engine instance (the ``date`` header, 13-digit times, receipt prefixes) are
masked. The sequence covers successes and errors of the three hot routes, fall-backs
to the framework (validation, limits, auth) and a keep-alive connection closed by the
client's ``Connection: close``, twice: the second time the fast path serves the heads it
has read before without the parser (``tests/server/test_known_heads.py`` has the rest).
A second pair, made followers of a replicated deployment, compares their refusals (421
``not_leader`` naming the leader, 503 ``no_leader``).
"""

from __future__ import annotations

import base64
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dq.shm import command_codec as codec
from dq.shm.attach import attach
from dq.shm.command_ring import FLAG_NO_QUEUE, ClientRing, Op, Response, Status
from tests.server.live import LiveServer, live_server
from tests.server.masked import mask
from tests.server.threaded import threaded_server

pytestmark = pytest.mark.integration  # live dq serve processes

TOKEN = "t0ken"
ENV = {
    "DQ_TOKENS": TOKEN,
    "DQ_MAX_BATCH": "5",
    "DQ_MAX_VALUE_BYTES": "64",
    "DQ_MAX_BODY_BYTES": "4096",
    "DQ_EXPIRE_INTERVAL_MS": "60000",
}


class Raw:
    """One keep-alive connection speaking raw bytes, reading whole responses."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""

    def send(
        self,
        path: str,
        body: bytes,
        *,
        token: str | None = TOKEN,
        close: bool = False,
        ctype: str = "application/json",
        extra: tuple[str, ...] = (),
    ) -> bytes:
        head = [f"POST {path} HTTP/1.1", "host: x", *extra, f"content-type: {ctype}"]
        head.append(f"content-length: {len(body)}")
        if token is not None:
            head.append(f"authorization: Bearer {token}")
        if close:
            head.append("connection: close")
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        return self._response()

    def _response(self) -> bytes:
        while b"\r\n\r\n" not in self.buf:
            self._more()
        head, _, rest = self.buf.partition(b"\r\n\r\n")
        match = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
        length = int(match.group(1)) if match else 0
        while len(rest) < length:
            self.buf = head + b"\r\n\r\n" + rest
            self._more()
            head, _, rest = self.buf.partition(b"\r\n\r\n")
        self.buf = rest[length:]
        return head + b"\r\n\r\n" + rest[:length]

    def _more(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed")
        self.buf += data

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, LiveServer]]:
    base: Path = tmp_path_factory.mktemp("dq-hot")
    with (
        live_server(base / "fast", env=ENV) as fast,
        live_server(base / "slow", env={**ENV, "DQ_FAST_PATH": "0"}) as slow,
    ):
        yield fast, slow


def _j(doc: object) -> bytes:
    return json.dumps(doc).encode()


def _script(conn: Raw) -> Iterator[bytes]:
    """The requests, in order; receipts are taken from the answers themselves."""
    q = "/v1/queues/hot"
    yield conn.send(q + "/items", _j({"items": [{"value": "a"}]}))
    yield conn.send(
        q + "/items",
        _j(
            {
                "items": [
                    {"value": "é ünïcode ✓"},
                    {"value": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64"},
                    {"value": "later", "delay_ms": 3_600_000},
                    {"value": "past", "deadline": 1},
                ]
            }
        ),
    )
    for ctype in ("application/json; charset=utf-8", "Application/JSON", "text/plain"):
        yield conn.send(q + "/items", _j({"items": [{"value": ctype}]}), ctype=ctype)
    # a header given twice: the first one counts, on either path
    yield conn.send(
        q + "/items", _j({"items": [{"value": "t"}]}), extra=("content-type: text/plain",)
    )
    yield conn.send(
        q + "/items", _j({"items": [{"value": "a"}]}), extra=("authorization: Bearer no",)
    )
    keyed = _j({"items": [{"value": "once", "key": "order-17"}]})
    yield conn.send(q + "/items", keyed)
    yield conn.send(q + "/items", keyed)  # a duplicate: the first item's id, nothing written
    yield conn.send(q + "/items", _j({"items": [{"value": "x" * 65}]}))  # value_too_large
    # bodies as the compiled reader reads them: escapes, raw UTF-8, every field, nulls;
    # read back at once from a queue of their own (then released: empty for the next run;
    # its first enqueue creates it, which the framework does)
    esc = "/v1/queues/hot-escapes"
    yield conn.send(
        esc + "/items",
        json.dumps(
            {"items": [{"value": "raw ünïcode ✓", "key": None, "group": None, "delay_ms": None}]},
            ensure_ascii=False,
            indent=1,
        ).encode(),
    )
    yield conn.send(
        esc + "/items",
        b'{"items":[{"value":"\\u00e9\\ud83d\\ude00 \\"q\\" \\\\ \\/ \\n\\u0000",'
        b'"key":"k\\u00e9","group":"g-1","on_duplicate":"replace","deadline":1,"delay_ms":null}]}',
    )
    got = conn.send(esc + "/dequeue", b'{"count": 5, "encoding": "utf-8"}')
    yield got
    back = json.loads(got.partition(b"\r\n\r\n")[2])["items"]
    release = [{"id": i["id"], "receipt": i["receipt"]} for i in back]
    yield conn.send(esc + "/release", _j({"items": release}))
    # what pydantic accepts but the compiled reader leaves to the framework: lax numbers,
    # a repeated key; and what neither accepts: NUL, invalid UTF-8, a lone surrogate, bad
    # base64 (each answered by the framework, the same bytes either way)
    for body in (
        b'{"items":[{"value":"lax","deadline":5.0}]}',
        b'{"items":[{"value":"lax","delay_ms":"5"}]}',
        b'{"items":[{"value":"first","value":"last"}]}',
        b'{"items":[{"value":"nul"}]}\x00',
        b'{"items":[{"value":"\xed\xa0\x80"}]}',
        b'{"items":[{"value":"\\ud800"}]}',
        b'{"items":[{"value":"YQ","encoding":"base64"}]}',
        b'{"items":[{"value":"a","encoding":"UTF-8"}]}',
        b'{"items":[{"value":"a","deadline":-1}]}',
        b'{"items":[{"value":"a","deadline":281474976710656}]}',
    ):
        yield conn.send(q + "/items", body)
    yield conn.send("/v1/queues/sp%20ace/items", _j({"items": [{"value": "x"}]}))
    # a query or a %-escape in the URL, answered by the framework after all
    yield conn.send(q + "/items?x=1", _j({"items": []}))
    yield conn.send("/v1/queues/h%6Ft2/items", _j({"items": [{"value": "new queue"}]}))
    yield conn.send(q + "/dequeue?", _j({"count": 6}))
    yield conn.send(q + "/items", _j({"items": [{"value": "x"}] * 6}))  # batch_too_large
    yield conn.send(q + "/items", _j({"items": [{"value": "x", "deadline": 1, "delay_ms": 1}]}))
    yield conn.send(q + "/items", b'{"items": [')  # invalid JSON
    yield conn.send(q + "/items", _j({"items": []}))
    yield conn.send(q + "/items", _j({"items": [{"value": "a"}]}), token=None)
    yield conn.send(q + "/items", _j({"items": [{"value": "a"}]}), token="wrong")
    got = conn.send(q + "/dequeue", _j({"count": 2}))
    yield got
    items = json.loads(got.partition(b"\r\n\r\n")[2])["items"]
    yield conn.send(q + "/dequeue", _j({"count": 1, "encoding": "base64"}))
    yield conn.send(q + "/dequeue", _j({"count": 6}))  # over the batch limit
    yield conn.send(q + "/dequeue", _j({"count": 0}))
    yield conn.send(q + "/dequeue", b'{"count": 1.0, "lease_ms": null, "encoding": null}')
    yield conn.send(q + "/dequeue", b'{"count": 1, "count": 1}')
    yield conn.send(q + "/dequeue", b'{"lease_ms": 0}')
    yield conn.send(q + "/dequeue", b'{"count": 1, "release": null')
    yield conn.send("/v1/queues/nothing-yet/dequeue", _j({"count": 3}))
    yield conn.send("/v1/queues/nothing-yet/dequeue", _j({"count": 1, "wait_ms": 50}))
    first = {"id": items[0]["id"], "receipt": items[0]["receipt"]}
    yield conn.send(q + "/release", _j({"items": [first]}))
    yield conn.send(q + "/release", _j({"items": [first]}))  # stale now
    yield conn.send(q + "/release", _j({"items": [{"id": 99, "receipt": "nope"}]}))
    yield conn.send(q + "/release", b'{"items": [{"id": "99", "receipt": "nope"}]}')
    yield conn.send(q + "/release", b'{"items": [{"id": 99, "receipt": ""}]}')
    yield conn.send(q + "/release", b'{"items": [{"id": 18446744073709551616, "receipt": "x"}]}')
    yield conn.send(q + "/release", _j({"items": [{"id": 1, "receipt": "x"}] * 6}))
    yield conn.send("/v1/queues/nothing-yet/release", _j({"items": [first]}))
    second = {"id": items[1]["id"], "receipt": items[1]["receipt"]}
    yield conn.send(q + "/dequeue", _j({"count": 1, "release": [second, first]}))
    yield conn.send("/v1/queues/nothing-yet/dequeue", _j({"count": 1, "release": [first]}))
    yield conn.send(q + "/dequeue", _j({"count": 1, "release": [first] * 6}))
    yield conn.send(q + "/items", _j({"items": [{"value": "bye"}]}), close=True)


def test_fast_path_and_framework_answer_the_same_bytes(
    pair: tuple[LiveServer, LiveServer],
) -> None:
    fast, slow = pair
    answers = []
    for server in (fast, slow):
        got = []
        for _ in range(2):  # the second time, the fast path has read every head before
            conn = Raw(server.port)
            try:
                got += [mask(r) for r in _script(conn)]  # it ends closing the connection
            finally:
                conn.close()
            conn = Raw(server.port)
            try:
                conn.sock.sendall(  # the second time starts from the same state
                    f"DELETE /v1/queues/hot HTTP/1.1\r\nhost: x\r\n"
                    f"authorization: Bearer {TOKEN}\r\n\r\n".encode()
                )
                got.append(mask(conn._response()))
            finally:
                conn.close()
        answers.append(got)
    assert len(answers[0]) == len(answers[1])
    for n, (a, b) in enumerate(zip(*answers, strict=True)):
        assert a == b, f"request {n}:\nfast: {a!r}\nslow: {b!r}"
    statuses = [int(a.split(b" ", 2)[1]) for a in answers[0]]
    assert {200, 400, 401, 404, 413, 422} <= set(statuses)
    assert b"connection: close" in answers[0][-2] and b" 204 " in answers[0][-1]


def test_fast_path_counts_in_metrics(pair: tuple[LiveServer, LiveServer]) -> None:
    fast, _ = pair
    conn = Raw(fast.port)
    try:
        conn.send("/v1/queues/counted/items", _j({"items": [{"value": "a"}]}))
        conn.send("/v1/queues/counted/items", _j({"items": [{"value": "x" * 65}]}))
        conn.sock.sendall(
            f"GET /metrics HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\r\n".encode()
        )
        text = conn._response().decode()
    finally:
        conn.close()
    assert 'dq_requests_total{operation="enqueue",outcome="ok"}' in text
    assert 'dq_requests_total{operation="enqueue",outcome="value_too_large"}' in text


def test_pipelined_requests_are_answered_in_order(pair: tuple[LiveServer, LiveServer]) -> None:
    """Several requests in one packet: each is answered, in order, fast path or not."""
    fast, _ = pair
    conn = Raw(fast.port)

    def request(path: str, body: bytes) -> bytes:
        head = (
            f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nauthorization: Bearer {TOKEN}\r\n\r\n"
        )
        return head.encode() + body

    q = "/v1/queues/piped"
    try:
        conn.sock.sendall(
            request(q + "/items", _j({"items": [{"value": "1"}]}))
            + request(q + "/items", _j({"items": []}))  # the framework answers this one
            + request(q + "/items", _j({"items": [{"value": "2"}]}))
            + request(q + "/dequeue", _j({"count": 5}))
        )
        answers = [conn._response() for _ in range(4)]
    finally:
        conn.close()
    assert [int(a.split(b" ", 2)[1]) for a in answers] == [200, 422, 200, 200]
    items = json.loads(answers[3].partition(b"\r\n\r\n")[2])["items"]
    assert [i["value"] for i in items] == ["1", "2"]


# ------------------------------------------------------------------ the ring, where it overlaps

#: What a step answered, in terms both transports can say: an error as (status, code,
#: message); an enqueue as its ids; a dequeue as (id, value, deliveries) per item and
#: whether the queue exists; a release as (id, ok, error) per item.
Answer = tuple[Any, ...]
#: (route, ring op) of each kind of step
KINDS = {
    "enqueue": ("items", Op.PUT),
    "dequeue": ("dequeue", Op.FIND),
    "release": ("release", Op.DELETE),
}


def _http_answer(raw: bytes, kind: str, receipts: list[tuple[int, str]]) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    doc = json.loads(body)
    if status != 200:
        return ("error", status, doc["error"], doc["message"])
    if kind == "enqueue":
        return ("enqueued", [i["id"] for i in doc["items"]])
    if kind == "dequeue":
        receipts += [(i["id"], i["receipt"]) for i in doc["items"]]
        items = [(i["id"], i["value"].encode(), i["stats"]["dequeue_count"]) for i in doc["items"]]
        return ("leased", items, doc.get("queue_exists", True))
    return ("released", [(doc["id"], doc["ok"], doc.get("error"))])


def _ring_answer(r: Response, kind: str, receipts: list[tuple[int, str]], item_id: int) -> Answer:
    if r.status != Status.OK:
        status = Status(r.status)
        return ("error", status.http_status, status.code, r.body.decode())
    if kind == "enqueue":
        return ("enqueued", [codec.decode_put_ok(r.body)[0]])
    if kind == "dequeue":
        got = codec.decode_deliveries(r.body)
        receipts += [(d.id, d.receipt) for d in got]
        items = [(d.id, d.value, d.stats.dequeue_count) for d in got]
        return ("leased", items, not r.flags & FLAG_NO_QUEUE)
    return ("released", [(item_id, True, None)])


class _Steps:
    """One transport's side of the overlap: each step sent over HTTP (the fast path) or
    as one ring command, on the transport's own queue of one server."""

    def __init__(self, transport: str, conn: Raw, ring: ClientRing) -> None:
        self.http = transport == "http"
        self.queue = f"overlap-{transport}"
        self.conn, self.ring = conn, ring
        self.answers: list[Answer] = []
        self.receipts: list[tuple[int, str]] = []

    def __call__(
        self, kind: str, body: dict[str, Any], key: bytes, value: bytes = b"", queue: str = ""
    ) -> None:
        queue = queue or self.queue
        route, op = KINDS[kind]
        item_id = body.pop("id", 0)
        if kind == "release":  # one item's release: its error is the answer's status
            route = f"items/{item_id}/release"
        if self.http:
            raw = self.conn.send(f"/v1/queues/{queue}/{route}", _j(body))
            answer = _http_answer(raw, kind, self.receipts)
        else:
            assert self.ring.call(Op.BIND, bytes(16), queue.encode()).status == Status.OK
            answer = _ring_answer(self.ring.call(op, key, value), kind, self.receipts, item_id)
        self.answers.append(answer)


def test_the_ring_answers_what_http_answers_where_they_overlap(
    pair: tuple[LiveServer, LiveServer],
) -> None:
    """The steps a ring command can carry — a single enqueue, a dequeue, a release, and
    their refusals — answer the same over the ring as over HTTP (the fast path, held to
    the framework's bytes above), each transport on a fresh queue of the same server."""
    fast, _ = pair
    conn = Raw(fast.port)
    attachment = attach(fast.data_dir, capacity=8)
    ring = ClientRing(attachment.mm, spin_us=0.0)
    sides = [_Steps("http", conn, ring), _Steps("ring", conn, ring)]
    now = codec.encode_put(None, None)
    try:
        for step in sides:
            step("enqueue", {"items": [{"value": "a"}]}, now, b"a")
            step("enqueue", {"items": [{"value": "b"}]}, now, b"b")
            step("enqueue", {"items": [{"value": "x" * 65}]}, now, b"x" * 65)  # too large
            step("dequeue", {"count": 6}, codec.encode_find(6, 0, None))  # over the limit
            over_12h = {"count": 1, "lease_ms": 43_200_001}
            step("dequeue", over_12h, codec.encode_find(1, 0, 43_200_001))
            step("dequeue", {"count": 1}, codec.encode_find(1, 0, None), queue="nothing-yet")
            step("dequeue", {"count": 2}, codec.encode_find(2, 0, None))
            item_id, receipt = step.receipts[0]  # each transport's own receipt
            key, value = codec.encode_item(item_id, receipt)
            for queue in ("", "", "nothing-yet"):  # released, then stale, then no queue
                step("release", {"id": item_id, "receipt": receipt}, key, value, queue=queue)
    finally:
        attachment.close()
        conn.close()
    http, over_ring = sides
    for n, (a, b) in enumerate(zip(http.answers, over_ring.answers, strict=True)):
        assert a == b, f"step {n}:\nhttp: {a!r}\nring: {b!r}"
    kinds = [a[0] for a in http.answers]
    assert kinds.count("error") == 5 and kinds.count("leased") == 2, http.answers
    assert [a[2] for a in http.answers[-2:]] == ["stale_receipt", "queue_not_found"]
    assert http.answers[5] == ("leased", [], False)  # the queue does not exist


# ------------------------------------------------------------------ a follower's refusals

LEADER = "http://127.0.0.1:1/leader"  # never contacted: only named in the answers


@pytest.fixture(scope="module")
def followers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A fast-path server and a framework-only one, in this process so that their
    engines can be made followers (``Engine.set_role``)."""
    base: Path = tmp_path_factory.mktemp("dq-hot-follower")
    settings = {"tokens": (TOKEN,), "max_batch": 5, "max_value_bytes": 64, "shm": False}
    with (
        threaded_server(base / "fast", **settings) as fast,
        threaded_server(base / "slow", fast_path=False, **settings) as slow,
    ):
        for server in (fast, slow):  # a queue the fast path serves (it exists)
            conn = Raw(server.port)
            try:
                conn.send("/v1/queues/hot/items", _j({"items": [{"value": "a"}]}))
            finally:
                conn.close()
        yield fast, slow


def _follower_script(conn: Raw) -> Iterator[bytes]:
    q = "/v1/queues/hot"
    yield conn.send(q + "/items", _j({"items": [{"value": "a"}]}))
    yield conn.send(q + "/dequeue", _j({"count": 2}))
    yield conn.send(q + "/dequeue", _j({"count": 1, "wait_ms": 50}))
    yield conn.send(q + "/release", _j({"items": [{"id": 1, "receipt": "x"}]}))
    yield conn.send(q + "/dequeue", _j({"count": 1, "release": [{"id": 1, "receipt": "x"}]}))
    yield conn.send("/v1/queues/nothing-yet/items", _j({"items": [{"value": "a"}]}))
    yield conn.send(q + "/items", _j({"items": [{"value": "x" * 65}]}))  # bad input first
    yield conn.send(q + "/items", _j({"items": [{"value": "bye"}]}), close=True)


@pytest.mark.parametrize("leader", [LEADER, None], ids=["not_leader", "no_leader"])
def test_a_followers_refusals_are_the_same_bytes(
    followers: tuple[Any, Any], leader: str | None
) -> None:
    answers = []
    hot = followers[0].app.state.fast_path.hot
    served_hot: list[int] = []
    failed = hot._failed

    def spy(*args: Any) -> None:  # counts the refusals the fast path itself answers
        served_hot.append(1)
        failed(*args)

    hot._failed = spy
    for server in followers:
        server.engine.set_role(False, leader)
        conn = Raw(server.port)
        try:
            answers.append([mask(r) for r in _follower_script(conn)])
        finally:
            conn.close()
            server.engine.set_role(True)
    del hot._failed
    assert len(served_hot) >= 5  # not all of them fell back to the framework
    for n, (a, b) in enumerate(zip(*answers, strict=True)):
        assert a == b, f"request {n}:\nfast: {a!r}\nslow: {b!r}"
    statuses = [int(a.split(b" ", 2)[1]) for a in answers[0]]
    refused = 421 if leader else 503
    assert statuses == [refused] * 6 + [413, refused]
    head, _, body = answers[0][0].partition(b"\r\n\r\n")
    doc = json.loads(body)
    if leader:
        assert doc["error"] == "not_leader" and doc["leader"] == LEADER
        assert f"x-dq-leader: {LEADER}\r\n".encode() in head
    else:
        assert doc["error"] == "no_leader" and "leader" not in doc
        assert b"retry-after: 1\r\n" in head
        # no leader to send the request to: the message says so, and what to do
        assert "knows no leader" in doc["message"] and "there" not in doc["message"]
