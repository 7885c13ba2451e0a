"""HTTP routes of the at-least-once consumer protocol and of keyed (idempotent) enqueue.

Owns ``/v1/queues/{queue}/consumers/...`` and ``/v1/queues/{queue}/batches``. It holds
no state: the lifespan opens and closes the consumer-group log
(``server/consumer_groups.py``) and the keyed-batch memory (``server/keyed_batches.py``),
and the routes get them through ``Groups`` and ``Batches`` (``server/dependencies.py``);
request and response models are in ``server/consumer_schemas.py``. Handlers are
plain ``def`` so that engine calls, which may wait on fsync, run in the thread pool and
never on the event loop. The protocol is specified in ``docs/spark.md``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from dq.server.consumer_groups import CommitResult, ConsumerState, LogEntry
from dq.server.consumer_schemas import (
    CommitBody,
    CommitOut,
    ConsumerList,
    ConsumerOut,
    KeyedBatch,
    KeyedBatchOut,
    OpenBody,
    OpenOut,
    PullBody,
    PullOut,
    ReadBody,
    ReadOut,
    RequeueBody,
    SeqsBody,
)
from dq.server.dependencies import Batches, Groups
from dq.server.errors import ApiError
from dq.server.routers._common import ERRORS, json_response
from dq.storage.types import NewItem, check_queue_name

__all__ = ["router"]

router = APIRouter(prefix="/v1/queues/{queue}", tags=["consumers"], responses=ERRORS)

NAME = r"^[A-Za-z0-9._-]{1,128}$"
QueueName = Annotated[str, Path(pattern=NAME)]
ConsumerName = Annotated[str, Path(pattern=NAME)]


def _json(body: Any) -> Response:
    # Plain json.dumps: the read route is the hot path of every Spark task.
    return json_response(body)


def _not_found(queue: str, consumer: str) -> ApiError:
    return ApiError(404, "consumer_not_found", f"no consumer {consumer!r} on queue {queue!r}")


def _state(s: ConsumerState) -> dict[str, Any]:
    return {
        "queue": s.queue,
        "consumer": s.consumer,
        "epoch": s.epoch,
        "next_seq": s.next_seq,
        "first_unacked": s.first_unacked,
        "in_flight": s.in_flight,
        "bytes": s.bytes,
        "lease_ms": s.lease_ms,
        "idle_timeout_ms": s.idle_timeout_ms,
        "lost": s.lost,
    }


def _commit(r: CommitResult) -> dict[str, Any]:
    return {
        "released": r.released,
        "stale": r.stale,
        "first_unacked": r.first_unacked,
        "next_seq": r.next_seq,
    }


@router.get("/consumers", response_model=ConsumerList)
def list_consumers(queue: QueueName, groups: Groups) -> Response:
    return _json({"consumers": [_state(s) for s in groups.consumers(queue)]})


@router.put("/consumers/{consumer}", response_model=OpenOut)
def open_consumer(
    queue: QueueName, consumer: ConsumerName, groups: Groups, body: OpenBody | None = None
) -> Response:
    """Create the consumer (at sequence 0) or return it; sets its lease and idle timeout.

    Also answers ``queue_due``, the queue's due count now (a bound for availableNow runs).
    """
    body = body or OpenBody()
    check_queue_name(queue)
    s = groups.open(queue, consumer, lease_ms=body.lease_ms, idle_timeout_ms=body.idle_timeout_ms)
    return _json(_state(s) | {"queue_due": groups.queue_due(queue)})


@router.get("/consumers/{consumer}", response_model=ConsumerOut)
def get_consumer(queue: QueueName, consumer: ConsumerName, groups: Groups) -> Response:
    s = groups.state(queue, consumer)
    if s is None:
        raise _not_found(queue, consumer)
    return _json(_state(s))


@router.delete("/consumers/{consumer}", status_code=204, response_class=Response)
def delete_consumer(queue: QueueName, consumer: ConsumerName, groups: Groups) -> Response:
    """Give back (requeue, due now) every item the consumer holds, then forget it."""
    if not groups.delete(queue, consumer):
        raise _not_found(queue, consumer)
    return Response(status_code=204)


@router.post("/consumers/{consumer}/pull", response_model=PullOut)
def pull(queue: QueueName, consumer: ConsumerName, body: PullBody, groups: Groups) -> Response:
    """Lease items into the log so that ``[after, end)`` holds up to ``max_items``."""
    r = groups.pull(
        queue,
        consumer,
        after=body.after,
        max_items=body.max_items,
        max_new=body.max_new,
        lease_ms=body.lease_ms,
    )
    answer: dict[str, object] = {
        "epoch": r.epoch,
        "start": r.start,
        "end": r.end,
        "pulled": r.pulled,
        "in_flight": r.in_flight,
    }
    if not r.queue_exists:  # said only then, as a dequeue says it
        answer["queue_exists"] = False
    return _json(answer)


def _item(e: LogEntry, force_b64: bool) -> dict[str, Any]:
    d = e.delivery
    value, encoding = None, "base64"
    if not force_b64:
        try:
            value, encoding = d.value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            value = None
    if value is None:
        value = base64.b64encode(d.value).decode("ascii")
    s = d.stats
    return {
        "seq": e.seq,
        "id": d.id,
        "receipt": e.receipt,
        "value": value,
        "encoding": encoding,
        "deadline": d.deadline,
        "stats": {
            "enqueue_time": s.enqueue_time,
            "requeue_time": s.requeue_time,
            "dequeue_count": s.dequeue_count,
        },
        "lease_expires": e.lease_expires,
    }


@router.post("/consumers/{consumer}/read", response_model=ReadOut)
def read(queue: QueueName, consumer: ConsumerName, body: ReadBody, groups: Groups) -> Response:
    """Entries ``start <= seq < end`` still un-acknowledged; re-readable until acknowledged.

    ``found`` is false when the server does not know the consumer (it restarted: those
    items are pending again and will be pulled into a later range).
    """
    epoch, entries = groups.read(queue, consumer, body.start, body.end)
    head = {"found": epoch is not None, "epoch": epoch}
    if body.layout == "columns":
        return _json(head | {"columns": _columns(entries)})
    force = body.encoding == "base64"
    return _json(head | {"items": [_item(e, force) for e in entries]})


def _columns(entries: list[LogEntry]) -> dict[str, Any]:
    ds = [e.delivery for e in entries]
    stats = [d.stats for d in ds]
    return {
        "seq": [e.seq for e in entries],
        "id": [d.id for d in ds],
        "receipt": [e.receipt for e in entries],
        "deadline": [d.deadline for d in ds],
        "enqueue_time": [s.enqueue_time for s in stats],
        "requeue_time": [s.requeue_time for s in stats],
        "dequeue_count": [s.dequeue_count for s in stats],
        "lease_expires": [e.lease_expires for e in entries],
        "lengths": [len(d.value) for d in ds],
        "values": base64.b64encode(b"".join(d.value for d in ds)).decode("ascii"),
    }


@router.post("/consumers/{consumer}/commit", response_model=CommitOut)
def commit(queue: QueueName, consumer: ConsumerName, body: CommitBody, groups: Groups) -> Response:
    """Release every entry below ``upto``. Idempotent."""
    return _json(_commit(groups.commit(queue, consumer, body.upto)))


@router.post("/consumers/{consumer}/ack", response_model=CommitOut)
def ack(queue: QueueName, consumer: ConsumerName, body: SeqsBody, groups: Groups) -> Response:
    """Release the entries named by sequence; unknown sequences are ignored."""
    return _json(_commit(groups.ack(queue, consumer, body.seqs)))


@router.post("/consumers/{consumer}/requeue", response_model=CommitOut)
def requeue(
    queue: QueueName, consumer: ConsumerName, body: RequeueBody, groups: Groups
) -> Response:
    """Give entries back with a new deadline (all of them when ``seqs`` is absent)."""
    r = groups.requeue(queue, consumer, body.seqs, deadline=body.deadline, delay_ms=body.delay_ms)
    return _json(_commit(r))


@router.post("/batches", response_model=KeyedBatchOut)
def enqueue_keyed(queue: QueueName, body: KeyedBatch, batches: Batches) -> Response:
    """Enqueue a batch once per ``key``: a repeated key returns the first result, enqueues nothing."""
    items = []
    for it in body.items:
        try:
            raw = (
                base64.b64decode(it.value, validate=True)
                if it.encoding == "base64"
                else it.value.encode("utf-8")
            )
        except ValueError:
            raise ApiError(400, "invalid_value", "value is not valid base64") from None
        items.append(NewItem(raw, it.deadline, it.delay_ms))
    result, replayed = batches.enqueue(queue, body.key, items)
    return _json(
        {
            "replayed": replayed,
            "items": [{"id": e.id, "deadline": e.deadline} for e in result],
        }
    )
