"""A ring's answers from the real engine through the compiled session and its handler
(``shm/_session.c``, ``shm/command_handler.py``): durable answers given by the thread
that made them durable, item errors, engine errors, refusals before the engine, and a
FIND of a queue nobody created (``docs/shm.md`` shows its bytes)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest

from dq.shm import command_codec as codec
from dq.shm.command_handler import CommandHandler
from dq.shm.command_ring import FLAG_DRAINING, FLAG_NO_QUEUE, Op, Status
from dq.storage import Engine, EngineConfig, NewItem
from dq.storage.errors import StorageError
from dq.storage.itemops import ItemOps
from tests.shm.ring_session import WAIT_S, Served
from tests.shm.test_command_ring import doc_example, response_bytes


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    with Engine.open(tmp_path / "data", EngineConfig(fsync="always")) as engine:
        yield engine


def served(engine: Engine, queue: str | None = "jobs", ops: ItemOps | None = None) -> Served:
    handler = CommandHandler(engine, queue, threading.Event(), ops)
    return Served(8, bound=queue is not None, handler=handler).start()


def test_put_delete_requeue_answers(engine: Engine) -> None:
    with served(engine) as ring:
        call = ring.client.call
        put = call(Op.PUT, codec.encode_put(None, None), b"v" * 256)
        assert put.status == Status.OK
        item_id, _ = codec.decode_put_ok(put.body)

        stale = call(Op.DELETE, *codec.encode_item(item_id, "nope"))
        assert (stale.status, stale.body) == (Status.INVALID_RECEIPT, b"malformed receipt")

        (delivery,) = codec.decode_deliveries(call(Op.FIND, codec.encode_find(1, 0, 30_000)).body)
        requeued = call(Op.REQUEUE, *codec.encode_requeue(delivery.id, delivery.receipt, 0, None))
        assert requeued.status == Status.OK and len(requeued.body) == 8

        (delivery,) = codec.decode_deliveries(call(Op.FIND, codec.encode_find(1, 0, 30_000)).body)
        key, value = codec.encode_item(delivery.id, delivery.receipt)
        released = call(Op.DELETE, key, value)
        assert (released.status, released.flags, released.body) == (Status.OK, 0, b"")
        again = call(Op.DELETE, key, value)
        assert again.status == Status.STALE_RECEIPT and again.body.startswith(
            b"that delivery is over"
        )
        assert engine.stats("jobs").pending == 0


def test_refusals_and_engine_errors(engine: Engine) -> None:
    with served(engine, None) as ring:
        call = ring.client.call
        unbound = call(Op.PUT, codec.encode_put(None, None), b"v")
        assert (unbound.status, unbound.body) == (
            Status.NOT_BOUND,
            b"no queue bound: send BIND first",
        )
        bad = call(Op.BIND, bytes(16), b"no/slash")
        assert bad.status == Status.INVALID_QUEUE_NAME
        assert call(Op.BIND, bytes(16), b"jobs").status == Status.OK
        unknown = call(42, bytes(16), b"")
        assert (unknown.status, unknown.body) == (Status.UNKNOWN_OP, b"unknown op 42")
        short = call(Op.REQUEUE, bytes(16), b"abc")
        assert (short.status, short.body) == (
            Status.MALFORMED,
            b"REQUEUE value must start with delay_ms u64 (size=3)",
        )
        zero = call(Op.EXTEND, *codec.encode_item(1, "r.1"))
        assert (zero.status, zero.body) == (Status.MALFORMED, b"EXTEND needs lease_ms > 0")
        late = call(Op.PUT, codec.encode_put(1 << 60, None), b"v")
        assert late.status == Status.VALIDATION_ERROR
        with mock.patch.object(
            ring.served_by, "_start_enqueue", side_effect=StorageError("disk full")
        ):
            failed = call(Op.PUT, codec.encode_put(None, None), b"v")
        assert (failed.status, failed.body) == (Status.INTERNAL, b"disk full")
        stats = call(Op.STATS, bytes(16), b"")  # nothing was written: no queue either
        assert (stats.status, stats.body) == (
            Status.QUEUE_NOT_FOUND,
            b"no such queue (queue='jobs')",
        )


def test_a_find_on_a_missing_queue_says_so_as_docs_shm_md_shows(engine: Engine) -> None:
    """``NO_QUEUE`` on a FIND of a queue nobody created, clear once it exists; with the
    server draining, ``DRAINING`` too."""
    raw = doc_example("find-no-queue-response")
    ops = ItemOps(engine)
    with served(engine, "not-yet", ops) as ring:
        find = ring.client.submit(Op.FIND, codec.encode_find(1, 0, 0), b"")
        ring.client.wait(find, WAIT_S)
        assert response_bytes(ring, find, len(raw)) == raw
        engine.enqueue("not-yet", [NewItem(b"v")])
        got = ring.client.call(Op.FIND, codec.encode_find(1, 0, 0), b"")
        assert (got.status, got.flags) == (Status.OK, 0)
        assert len(codec.decode_deliveries(got.body)) == 1
        ops.waits.drain()
        assert ring.client.call(Op.BIND, bytes(16), b"still-not").status == Status.OK
        waited = ring.client.call(Op.FIND, codec.encode_find(1, 5_000, 0), b"")
        assert (waited.status, waited.flags) == (Status.OK, FLAG_NO_QUEUE | FLAG_DRAINING)
