"""A single-slot durable command's answer, encoded by the thread that made it durable
(``CommandHandler.answer_one``), is byte for byte what the general path
(``finish_span(outcome, 1, whole=False)``) encodes: ok bodies, item errors, engine
errors, and bodies longer than a slot (cut, without MORE)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.shm import command_codec as codec
from dq.shm.command_handler import CommandHandler, Outcome
from dq.shm.command_ring import (
    FLAG_DRAINING,
    FLAG_NO_QUEUE,
    RESPONSE_BODY_MAX,
    Command,
    Op,
    Status,
    encode_response,
)
from dq.storage import Engine, EngineConfig, NewItem
from dq.storage.errors import StorageError
from dq.storage.itemops import ItemOps
from tests.shm.test_command_ring import doc_example

WAIT_S = 10.0


@pytest.fixture
def handler(tmp_path: Path) -> Iterator[CommandHandler]:
    engine = Engine.open(tmp_path / "data", EngineConfig(fsync="never"))
    try:
        yield CommandHandler(engine, "jobs", threading.Event())
    finally:
        engine.close()


def both(handler: CommandHandler, outcome: Outcome) -> bytes:
    if outcome.future is not None:
        with contextlib.suppress(Exception):  # an error is answered like a result
            outcome.future.result(timeout=WAIT_S)
        assert outcome.future.done()
    general = handler.finish_span(outcome, 1, whole=False)
    assert len(general) == 1
    assert handler.answer_one(outcome) == general[0]
    return general[0]


def test_put_delete_requeue_answers_match(handler: CommandHandler) -> None:
    put = handler.begin(Command(0, Op.PUT, codec.encode_put(None, None), b"v" * 256, 256))
    answer = both(handler, put)
    assert answer[0] == Status.OK and len(answer) == 4 + 16
    item_id, _ = codec.decode_put_ok(answer[4:])

    stale = handler.begin(Command(1, Op.DELETE, *codec.encode_item(item_id, "nope"), 4))
    assert both(handler, stale)[0] != Status.OK  # an item error, with its message

    find = handler.begin(Command(2, Op.FIND, codec.encode_find(1, 0, 30_000), b"", 0))
    (delivery,) = codec.decode_deliveries(handler.finish(find)[4:])
    key, value = codec.encode_requeue(delivery.id, delivery.receipt, 0, None)
    requeued = handler.begin(Command(3, Op.REQUEUE, key, value, len(value)))
    assert both(handler, requeued)[0] == Status.OK

    find = handler.begin(Command(4, Op.FIND, codec.encode_find(1, 0, 30_000), b"", 0))
    (delivery,) = codec.decode_deliveries(handler.finish(find)[4:])
    key, value = codec.encode_item(delivery.id, delivery.receipt)
    assert both(handler, handler.begin(Command(5, Op.DELETE, key, value, len(value)))) == (
        encode_response(Status.OK, b"")
    )
    again = handler.begin(Command(6, Op.DELETE, key, value, len(value)))
    assert both(handler, again)[0] != Status.OK


def test_refusals_errors_and_long_bodies_match(handler: CommandHandler) -> None:
    refused = handler.begin(Command(0, Op.PUT, bytes(16), b"", 2000))
    assert both(handler, refused)[0] == Status.VALUE_TOO_LARGE

    failed: concurrent.futures.Future[object] = concurrent.futures.Future()
    failed.set_exception(StorageError("disk full"))
    answer = both(handler, Outcome(None, failed, lambda r: (0, b"")))
    assert answer == encode_response(Status.INTERNAL, b"disk full")

    long = b"x" * (RESPONSE_BODY_MAX + 7)
    answer = both(handler, Outcome((int(Status.OK), long)))
    assert answer == encode_response(Status.OK, long[:RESPONSE_BODY_MAX])  # cut, no MORE

    done: concurrent.futures.Future[bytes] = concurrent.futures.Future()
    done.set_result(long)
    assert both(handler, Outcome(None, done, lambda r: (int(Status.OK), r))) == answer

    continued = Outcome(encoded=encode_response(Status.OK, b"abc", 1))
    assert both(handler, continued) == continued.encoded


def test_a_find_on_a_missing_queue_says_so_as_docs_shm_md_shows(tmp_path: Path) -> None:
    """``NO_QUEUE`` on a FIND of a queue nobody created, clear once it exists; with the
    server draining, ``DRAINING`` too."""
    raw = doc_example("find-no-queue-response")
    with Engine.open(tmp_path / "data", EngineConfig(fsync="never")) as engine:
        ops = ItemOps(engine)
        handler = CommandHandler(engine, "not-yet", threading.Event(), ops)
        find = Command(0, Op.FIND, codec.encode_find(1, 0, 0), b"", 0)
        assert handler.finish(handler.begin(find)) == raw[4:]
        engine.enqueue("not-yet", [NewItem(b"v")])
        answer = handler.finish(handler.begin(find))
        assert answer[:2] == bytes([Status.OK, 0]) and len(codec.decode_deliveries(answer[4:])) == 1
        ops.waits.drain()
        handler.queue = "still-not"
        waited = handler.finish(
            handler.begin(Command(0, Op.FIND, codec.encode_find(1, 5_000, 0), b"", 0))
        )
        assert waited[:2] == bytes([Status.OK, FLAG_NO_QUEUE | FLAG_DRAINING])
