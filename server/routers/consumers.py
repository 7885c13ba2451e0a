"""HTTP routes of the at-least-once consumer protocol and of keyed (idempotent) enqueue.

Owns ``/v1/queues/{queue}/consumers/...`` and ``/v1/queues/{queue}/batches``; the state
lives in ``dq.server.consumer_groups`` (one ``ConsumerGroups`` and one
``IdempotentBatches`` on ``app.state``, opened and closed with the engine). Handlers are
plain ``def`` so that engine calls, which may wait on fsync, run in the thread pool and
never on the event loop. The protocol is specified in ``docs/spark.md``.
"""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Request, Response
from pydantic import BaseModel, Field, model_validator

from dq.server.consumer_groups import (
    CommitResult,
    ConsumerGroups,
    ConsumerState,
    IdempotentBatches,
    LogEntry,
)
from dq.server.errors import ApiError
from dq.server.routers._common import ERRORS, json_response
from dq.storage.types import NewItem, check_queue_name

__all__ = ["install", "router"]

router = APIRouter(prefix="/v1/queues/{queue}", tags=["consumers"], responses=ERRORS)

NAME = r"^[A-Za-z0-9._-]{1,128}$"
QueueName = Annotated[str, Path(pattern=NAME)]
ConsumerName = Annotated[str, Path(pattern=NAME)]


def install(
    app: Any, engine: Any, *, max_batch: int = 1000, max_log_bytes: int = 256 << 20
) -> None:
    """Attach consumer state for ``engine`` to ``app.state`` and start lease keep-alive.

    Call from the app's lifespan after the engine opens; call ``uninstall`` before it closes.
    """
    groups = ConsumerGroups(engine, max_batch=max_batch, max_log_bytes=max_log_bytes)
    groups.start()
    app.state.consumer_groups = groups
    app.state.idempotent_batches = IdempotentBatches(engine)


def uninstall(app: Any) -> None:
    groups: ConsumerGroups | None = getattr(app.state, "consumer_groups", None)
    if groups is not None:
        groups.close()


def _groups(request: Request) -> ConsumerGroups:
    groups: ConsumerGroups = request.app.state.consumer_groups
    return groups


def _batches(request: Request) -> IdempotentBatches:
    batches: IdempotentBatches = request.app.state.idempotent_batches
    return batches


Groups = Annotated[ConsumerGroups, Depends(_groups)]
Batches = Annotated[IdempotentBatches, Depends(_batches)]


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


class OpenBody(BaseModel):
    lease_ms: int | None = Field(default=None, ge=1, le=12 * 3600_000)
    idle_timeout_ms: int | None = Field(default=None, ge=1000, le=7 * 24 * 3600_000)


class PullBody(BaseModel):
    after: int = Field(ge=0)
    max_items: int = Field(ge=0, le=1_000_000)
    max_new: int | None = Field(default=None, ge=0)
    lease_ms: int | None = Field(default=None, ge=1, le=12 * 3600_000)


class ReadBody(BaseModel):
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    encoding: Literal["base64", "auto"] = "base64"
    #: ``items``: a list of item objects; ``columns``: one array per field and every
    #: value in one base64 string (``values``) cut by ``lengths``: far cheaper to build
    #: and to turn into Arrow, which is what Spark executors do.
    layout: Literal["items", "columns"] = "items"


class CommitBody(BaseModel):
    upto: int = Field(ge=0)


class SeqsBody(BaseModel):
    seqs: list[int] = Field(max_length=1_000_000)


class RequeueBody(BaseModel):
    seqs: list[int] | None = None
    deadline: int | None = Field(default=None, ge=0, lt=1 << 48)
    delay_ms: int | None = Field(default=None, ge=0, lt=1 << 48)

    @model_validator(mode="after")
    def _one_time(self) -> RequeueBody:
        if self.deadline is not None and self.delay_ms is not None:
            raise ValueError("give deadline or delay_ms, not both")
        return self


class BatchItem(BaseModel):
    value: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    deadline: int | None = Field(default=None, ge=0, lt=1 << 48)
    delay_ms: int | None = Field(default=None, ge=0, lt=1 << 48)


class KeyedBatch(BaseModel):
    key: str = Field(min_length=1, max_length=512)
    items: list[BatchItem] = Field(min_length=1)


@router.get("/consumers")
def list_consumers(queue: QueueName, groups: Groups) -> Response:
    return _json({"consumers": [_state(s) for s in groups.consumers(queue)]})


@router.put("/consumers/{consumer}")
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


@router.get("/consumers/{consumer}")
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


@router.post("/consumers/{consumer}/pull")
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
    return _json(
        {
            "epoch": r.epoch,
            "start": r.start,
            "end": r.end,
            "pulled": r.pulled,
            "in_flight": r.in_flight,
        }
    )


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


@router.post("/consumers/{consumer}/read")
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


@router.post("/consumers/{consumer}/commit")
def commit(queue: QueueName, consumer: ConsumerName, body: CommitBody, groups: Groups) -> Response:
    """Release every entry below ``upto``. Idempotent."""
    return _json(_commit(groups.commit(queue, consumer, body.upto)))


@router.post("/consumers/{consumer}/ack")
def ack(queue: QueueName, consumer: ConsumerName, body: SeqsBody, groups: Groups) -> Response:
    """Release the entries named by sequence; unknown sequences are ignored."""
    return _json(_commit(groups.ack(queue, consumer, body.seqs)))


@router.post("/consumers/{consumer}/requeue")
def requeue(
    queue: QueueName, consumer: ConsumerName, body: RequeueBody, groups: Groups
) -> Response:
    """Give entries back with a new deadline (all of them when ``seqs`` is absent)."""
    r = groups.requeue(queue, consumer, body.seqs, deadline=body.deadline, delay_ms=body.delay_ms)
    return _json(_commit(r))


@router.post("/batches")
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
