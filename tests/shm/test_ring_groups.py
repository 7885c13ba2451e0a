"""Groups over the shared-memory ring the way a user meets them: a live ``dq serve``, a
``Client("shm://…")`` whose HTTP address leads nowhere (so what it gets came over the
ring), items enqueued with and without ``group=``; every delivery over the ring names
the group it was enqueued with, or None, as over HTTP (``docs/shm.md``, the attach's
``groups``; ``docs/client.md``). A client that does not ask for groups (one written
before them) gets the answers it always got.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from dq.client import AsyncClient, Client, NewItem, QueueConfig
from dq.shm import command_codec as codec
from dq.shm.attach import attach
from dq.shm.command_ring import FLAG_GROUPS, ClientRing, Op, Status
from tests.server.live import LiveServer, served

pytestmark = pytest.mark.integration  # a live dq serve, over HTTP and its rings

ENV = {"DQ_SHM": "1", "DQ_EXPIRE_INTERVAL_MS": "50"}
NOWHERE = "http://127.0.0.1:9"  # the ring client's HTTP: any call sent there fails
WAIT_S = 10.0
#: the longest group, every printable character the rule allows among them
LONGEST = ("~ !azAZ09-_." * 11)[:128]


server, http = served(ENV)


@pytest.fixture
def ring(server: LiveServer) -> Iterator[Client]:
    with Client(f"shm://{server.data_dir}", http_url=NOWHERE) as c:
        yield c


def test_ring_deliveries_carry_the_group_they_were_enqueued_with(
    http: Client, ring: Client
) -> None:
    sent = {
        http.enqueue("g1", b"a", group="customer-42"): "customer-42",
        http.enqueue("g1", b"b"): None,
        http.enqueue("g1", b"c", group=LONGEST): LONGEST,
        http.enqueue("g1", b"d", group="x"): "x",
    }
    got = ring.dequeue("g1", 10, lease_ms=60_000)
    assert {item.id: item.group for item in got} == sent
    # the same fields as the HTTP client sees for the same items
    peeked = {p.id: p.group for p in http.browse("g1").items}
    assert peeked == sent


def test_a_ring_answer_over_many_slots_keeps_every_group(http: Client, ring: Client) -> None:
    """Values near 1 KiB: the answer spans slots and CONTINUEs, every chunk in the layout
    with groups; a dequeue that carries releases too (its FIND follows DELETEs)."""
    items = [
        NewItem(bytes([n]) * 1000, group=None if n % 3 == 0 else f"tenant-{n}") for n in range(30)
    ]
    ids = [e.id for e in http.enqueue_many("g2", items)]
    first = ring.dequeue("g2", 10, lease_ms=60_000)
    rest = ring.dequeue("g2", 30, lease_ms=60_000, release=first)
    assert all(o.ok for o in rest.released)
    got = [*first, *rest]
    assert [i.id for i in got] == ids
    assert [(i.value, i.group) for i in got] == [(n.value, n.group) for n in items]


def test_an_async_ring_client_gets_the_groups(server: LiveServer, http: Client) -> None:
    http.put_queue("g3", QueueConfig(group_limit=1))
    http.enqueue_many("g3", [NewItem(b"1", group="c"), NewItem(b"2", group="c")])

    async def dequeue() -> list[tuple[bytes, str | None]]:
        async with AsyncClient(f"shm://{server.data_dir}", http_url=NOWHERE) as dq:
            got = await dq.dequeue("g3", 5, lease_ms=60_000)
            return [(i.value, i.group) for i in got]

    assert asyncio.run(asyncio.wait_for(dequeue(), WAIT_S)) == [(b"1", "c")]  # one per group


def test_a_client_that_does_not_ask_for_groups_gets_the_older_answers(
    server: LiveServer, http: Client
) -> None:
    http.enqueue("g4", b"old", group="kept-back")
    http.enqueue("g4", b"new", group="sent")
    for groups, wanted in ((False, [(b"old", None)]), (True, [(b"new", "sent")])):
        a = attach(server.data_dir, queue="g4", capacity=4, groups=groups)
        try:
            r = ClientRing(a.mm, spin_us=0.0).call(
                Op.FIND, codec.encode_find(1, 0, 60_000), b"", timeout_s=WAIT_S
            )
        finally:
            a.close()
        assert r.status == Status.OK
        assert bool(r.flags & FLAG_GROUPS) is groups
        got = codec.decode_deliveries(r.body, r.flags)
        assert [(d.value, d.group) for d in got] == wanted
        if not groups:  # the 50-byte head and nothing after the value: as it always was
            assert len(r.body) == 4 + 50 + len(got[0].receipt) + 3
