"""One wording per rule, on every path.

A request that breaks a rule — a lease over 12 h or under 1 ms, a count outside 1 to
the server's batch limit, a negative wait — is refused with the same status, code and
words over HTTP (the fast path; ``tests/server/test_hot_path.py`` holds the framework to
the fast path's bytes), over the ring (the server's own check, reached by a raw ring),
and by the Python client's own check before it sends (``Client("shm://...")``, whose
ring fields cannot carry a 0 or a negative number). The words are the rule's
(``storage/validation.py``), never the validator's ("Input should be greater than or
equal to 1") nor the framework's location (``body.``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from dq.client import Client
from dq.client.errors import ServerError
from dq.shm import command_codec as codec
from dq.shm.attach import attach
from dq.shm.command_ring import ClientRing, Op, Status
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live dq serve, over HTTP and its rings

MAX_BATCH = 5
ENV = {"DQ_SHM": "1", "DQ_MAX_BATCH": str(MAX_BATCH)}
LEASE = "lease_ms must be between 1 and 43200000"
COUNT = f"count must be between 1 and {MAX_BATCH}"
WAIT = "wait_ms must be between 0 and 281474976710655"
RECEIPT = "receipt must be between 1 and 512 characters"
DEADLINE = "deadline must be between 0 and 281474976710655"
DELAY = "delay_ms must be between 0 and 281474976710655"
BOTH = "give deadline or delay_ms, not both (delay_ms is relative to now)"

#: (dequeue arguments, the rule's words)
CASES: list[tuple[dict[str, int], str]] = [
    ({"lease_ms": 0}, LEASE),
    ({"lease_ms": -1}, LEASE),
    ({"lease_ms": 43_200_001}, LEASE),
    ({"count": 0}, COUNT),
    ({"count": -3}, COUNT),
    ({"count": MAX_BATCH + 1}, COUNT),
    ({"wait_ms": -1}, WAIT),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data", env=ENV) as s:
        with Client(s.url) as dq:
            dq.enqueue("rules", b"x")
        yield s


def _http(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, str, str]:
    r = httpx.post(f"{server.url}/v1/queues/rules/{path}", json=body, timeout=10)
    doc = r.json()
    return r.status_code, doc["error"], doc["message"]


@pytest.mark.parametrize(("args", "words"), CASES, ids=[str(a) for a, _ in CASES])
def test_a_dequeue_breaking_a_rule_is_refused_in_its_words_on_every_path(
    server: LiveServer, args: dict[str, int], words: str
) -> None:
    refusal = (422, "validation_error", words)
    assert _http(server, "dequeue", {"count": 1} | args) == refusal
    with Client(f"shm://{server.data_dir}") as ring, Client(server.url) as http:
        for client in (ring, http):
            with pytest.raises(ServerError) as refused:
                client.dequeue("rules", **args)
            assert (refused.value.status, refused.value.code, refused.value.message) == refusal
    assert Client(server.url).queue("rules").stats.leased == 0  # nothing was leased


def test_the_rings_own_check_says_the_same(server: LiveServer) -> None:
    """What a ring field can carry but the server refuses: the ring answers status
    ``validation_error`` (24) with the rule's words, as a client that does not check
    first (another language's) would see them."""
    attachment = attach(server.data_dir, queue="rules", capacity=4)
    try:
        ring = ClientRing(attachment.mm, spin_us=0.0)
        for key, words in [
            (codec.encode_find(1, 0, 43_200_001), LEASE),
            (codec.encode_find(MAX_BATCH + 1, 0, None), COUNT),
        ]:
            answer = ring.call(Op.FIND, key, b"", timeout_s=10)
            assert (answer.status, answer.body.decode()) == (Status.VALIDATION_ERROR, words)
    finally:
        attachment.close()


def test_batch_fields_name_the_item_and_say_the_rule(server: LiveServer) -> None:
    """In a batch the item is named in front of the rule, without the framework's
    ``body.``; the ``details`` keep pydantic's location."""
    status, code, message = _http(
        server, "extend", {"items": [{"id": 1, "receipt": "r", "lease_ms": 0}]}
    )
    assert (status, code, message) == (422, "validation_error", f"items.0: {LEASE}")
    status, code, message = _http(server, "release", {"items": [{"id": 1, "receipt": "r" * 513}]})
    assert (status, code, message) == (422, "validation_error", f"items.0: {RECEIPT}")
    r = httpx.post(f"{server.url}/v1/queues/rules/dequeue", json={"lease_ms": 0}, timeout=10)
    assert r.json()["details"] == [
        {"loc": ["body", "lease_ms"], "msg": LEASE, "type": "greater_than_equal"}
    ]
    # a rule the server checks itself (the batch limit is a setting) has its details too
    r = httpx.post(f"{server.url}/v1/queues/rules/dequeue", json={"count": 6}, timeout=10)
    assert r.json()["details"] == [{"loc": ["body", "count"], "msg": COUNT, "type": "value_error"}]
    with Client(f"shm://{server.data_dir}") as ring:
        with pytest.raises(ServerError) as refused:
            ring.extend("rules", 1, "r", 0)
        assert (refused.value.status, refused.value.message) == (422, LEASE)


@pytest.mark.parametrize(
    ("when", "words"),
    [
        ({"deadline": -1}, DEADLINE),
        ({"deadline": 1 << 48}, DEADLINE),
        ({"delay_ms": -5}, DELAY),
        ({"deadline": 5, "delay_ms": 5}, BOTH),
    ],
    ids=["deadline<0", "deadline>48 bits", "delay<0", "both"],
)
def test_when_an_item_is_due_is_refused_in_the_rules_words_on_every_path(
    server: LiveServer, when: dict[str, int], words: str
) -> None:
    """An enqueue's or a requeue's ``deadline`` and ``delay_ms``: 422, the rule's words
    (after the item's place in a batch), over HTTP, the ring's own check (a PUT carries
    any u64, and both fields), and the client's."""
    assert _http(server, "items", {"items": [{"value": "x", **when}]}) == (
        422,
        "validation_error",
        f"items.0: {words}",
    )
    with Client(f"shm://{server.data_dir}") as ring, Client(server.url) as http:
        (item,) = http.dequeue("rules", lease_ms=60_000)
        try:
            for client in (ring, http):
                for call in (
                    lambda c: c.enqueue("rules", b"x", **when),
                    lambda c: c.requeue("rules", item.id, item.receipt, **when),
                ):
                    with pytest.raises(ServerError) as refused:
                        call(client)
                    got = (refused.value.status, refused.value.code)
                    assert got == (422, "validation_error")
                    assert refused.value.message.endswith(words), refused.value.message
        finally:
            http.release("rules", item.id, item.receipt)
            http.enqueue("rules", b"x")
    if all(v >= 0 for v in when.values()):  # what a ring field can carry
        attachment = attach(server.data_dir, queue="rules", capacity=4)
        try:
            put = ClientRing(attachment.mm, spin_us=0.0).call(
                Op.PUT, codec.encode_put(when.get("deadline"), when.get("delay_ms")), b"x"
            )
            assert (put.status, put.body.decode()) == (Status.VALIDATION_ERROR, words)
        finally:
            attachment.close()
