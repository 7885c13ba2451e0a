"""ReceiveMessage, DeleteMessage, ChangeMessageVisibility (and their batches).

Receiving is a dq dequeue: the visibility timeout is the lease, the receipt handle is
the delivery's receipt (new on every delivery), ``ApproximateReceiveCount`` is the
item's delivery count and ``SentTimestamp`` its enqueue time; a long poll is dq's
long-poll. Deleting is a release; a visibility change is an extend of the lease, or,
to 0, a requeue due now. As in SQS, deleting with the receipt of a delivery that is
over (the message was received again, or already deleted) succeeds and changes nothing
on a standard queue, and is refused on a FIFO queue ("The receipt handle has expired").

On a FIFO queue a message's ``SequenceNumber`` is its item id (``dq.server.sqs.fifo``),
and a receive may carry a ``ReceiveRequestAttemptId`` (``dq.server.sqs.attempts``).
Which messages a receive gets — a group held while one of its messages is in flight —
is the engine's rule, not this module's.
"""

from __future__ import annotations

import time
from typing import Any

from dq.server.calls import durable, metered_durable
from dq.server.sqs import fifo
from dq.server.sqs.attempts import ChangedSince
from dq.server.sqs.batches import check_entries, failed
from dq.server.sqs.context import MAX_VISIBILITY_S, Ctx
from dq.server.sqs.errors import SqsError, from_storage
from dq.server.sqs.messages import decode, md5_hex, md5_of_attributes, message_id
from dq.server.sqs.names import queue_from_url
from dq.server.sqs.params import get_int, get_list, get_str, invalid
from dq.server.sqs.queue_attrs import DEFAULTS
from dq.storage.errors import StorageError
from dq.storage.types import Delivery, Extend, ItemOutcome, Release, Requeue

__all__ = [
    "change_message_visibility",
    "change_message_visibility_batch",
    "delete_message",
    "delete_message_batch",
    "receive_message",
]

_perf = time.perf_counter
_SYSTEM_NAMES = (
    "SenderId",
    "SentTimestamp",
    "ApproximateReceiveCount",
    "ApproximateFirstReceiveTimestamp",
    "MessageDeduplicationId",
    "MessageGroupId",
    "SequenceNumber",
    "AWSTraceHeader",
)


def _wanted_system(p: dict[str, Any]) -> set[str]:
    names = {str(n) for n in get_list(p, "AttributeNames")}
    names |= {str(n) for n in get_list(p, "MessageSystemAttributeNames")}
    return set(_SYSTEM_NAMES) if "All" in names else names


def _attribute_filter(p: dict[str, Any]) -> tuple[bool, set[str], tuple[str, ...]]:
    """(all?, exact names, prefixes) from ``MessageAttributeNames``."""
    names = [str(n) for n in get_list(p, "MessageAttributeNames")]
    every = any(n in ("All", ".*") for n in names)
    prefixes = tuple(n[:-1] for n in names if n.endswith(".*") and n != ".*")
    return every, {n for n in names if not n.endswith(".*")}, prefixes


def _message(
    ctx: Ctx,
    name: str,
    d: Delivery,
    now: int,
    wanted: set[str],
    chosen_by: tuple[bool, set[str], tuple[str, ...]],
    again: bool,
) -> dict[str, Any]:
    """One message of a receive's answer (``again``: answered before, to the same
    ``ReceiveRequestAttemptId``)."""
    stored = decode(d.value)
    body = stored.body
    out: dict[str, Any] = {
        "MessageId": message_id(name, d.id),
        "ReceiptHandle": d.receipt,
        "MD5OfBody": md5_hex(body.encode()),
        "Body": body,
    }
    receives = ctx.state.receives
    if again:
        first = receives.known(name, d.id)
    else:
        first = receives.on_delivery(name, d.id, d.stats.dequeue_count, now)
    system: dict[str, str | None] = {
        "SenderId": ctx.account,
        "SentTimestamp": str(d.stats.enqueue_time),
        "ApproximateReceiveCount": str(d.stats.dequeue_count),
        "ApproximateFirstReceiveTimestamp": None if first is None else str(first),
        "MessageDeduplicationId": stored.dedup_id,
        # the item's group; a message stored before groups were items' kept it in its envelope
        "MessageGroupId": d.group if d.group is not None else stored.group_id,
        "SequenceNumber": fifo.sequence_number(d.id) if fifo.is_fifo(name) else None,
        "AWSTraceHeader": stored.system_attributes.get("AWSTraceHeader", {}).get("StringValue"),
    }
    attributes = {k: v for k, v in system.items() if k in wanted and v is not None}
    if attributes:
        out["Attributes"] = attributes
    every, exact, prefixes = chosen_by
    chosen = {
        k: v for k, v in stored.attributes.items() if every or k in exact or k.startswith(prefixes)
    }
    if chosen:
        out["MessageAttributes"] = chosen
        out["MD5OfMessageAttributes"] = md5_of_attributes(chosen)
    return out


async def _receive(
    ctx: Ctx, name: str, p: dict[str, Any], count: int, lease_ms: int | None
) -> list[Delivery]:
    """One dequeue, long-poll included (the queue's ``ReceiveMessageWaitTimeSeconds``
    unless the request gives ``WaitTimeSeconds``)."""
    service = ctx.service
    t0 = _perf()
    try:
        sidecar = ctx.state.sidecars.load(ctx.engine, name)
        default_wait = int(
            sidecar.attributes.get(
                "ReceiveMessageWaitTimeSeconds", DEFAULTS["ReceiveMessageWaitTimeSeconds"]
            )
        )
        wait = get_int(p, "WaitTimeSeconds", 0, ctx.limits.max_wait_s, default=default_wait)
        got = await service.longpoll.dequeue(name, count, lease_ms, (wait or 0) * 1000, ctx.gone)
    except StorageError as exc:
        service.metrics.observe_error("dequeue", exc.code, _perf() - t0)
        raise from_storage(exc, name) from None
    service.metrics.observe("dequeue", _perf() - t0, len(got))
    service.metrics.observe_lateness(ctx.engine.now(), (d.deadline for d in got))
    return got


async def _attempted(
    ctx: Ctx, name: str, attempt_id: str, p: dict[str, Any], count: int, lease_ms: int | None
) -> tuple[list[Delivery], bool]:
    """A FIFO receive with a ``ReceiveRequestAttemptId``: the messages an earlier try
    received, still in flight, with their visibility timeout restarted (and True); else
    a receive anew, remembered under the attempt id."""
    attempts = ctx.state.attempts
    try:
        prior = attempts.find(name, attempt_id, ctx.engine.now())
    except ChangedSince:
        raise invalid(
            "ReceiveRequestAttemptId",
            attempt_id,
            "messages received with it were deleted or had their visibility changed since: "
            "receive with a new ReceiveRequestAttemptId.",
        ) from None
    if prior is not None:
        try:
            lease = prior.lease_ms or ctx.engine.get_queue(name).default_lease_ms
            outcomes = ctx.service.ops.extend(
                name, [Extend(d.id, d.receipt, lease) for d in prior.deliveries]
            )
        except StorageError as exc:
            raise from_storage(exc, name) from None
        live = [d for d, o in zip(prior.deliveries, outcomes, strict=True) if o.error is None]
        if live:
            attempts.keep(name, attempt_id, live)
            return live, True
    got = await _receive(ctx, name, p, count, lease_ms)
    if got:
        attempts.remember(name, attempt_id, ctx.engine.now(), lease_ms, got)
    return got, False


async def receive_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    count = get_int(p, "MaxNumberOfMessages", 1, ctx.limits.max_receive, default=1) or 1
    visibility = get_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
    lease_ms = None if visibility is None else max(1, visibility * 1000)
    wanted, chosen_by = _wanted_system(p), _attribute_filter(p)  # checked before leasing
    # SQS reads an attempt id on FIFO queues only
    attempt_id = get_str(p, "ReceiveRequestAttemptId") if fifo.is_fifo(name) else None
    again = False
    if attempt_id is None:
        got = await _receive(ctx, name, p, count, lease_ms)
    else:
        fifo.check_id("ReceiveRequestAttemptId", attempt_id)
        async with ctx.state.attempts.serial(name, attempt_id):
            got, again = await _attempted(ctx, name, attempt_id, p, count, lease_ms)
    if not got:
        return {}
    now = ctx.engine.now()
    return {"Messages": [_message(ctx, name, d, now, wanted, chosen_by, again) for d in got]}


def _handle(raw: object) -> tuple[str, int]:
    """A receipt handle and the item it names (``<epoch>.<id hex>.<delivery hex>``)."""
    handle = raw if isinstance(raw, str) else ""
    parts = handle.split(".")
    try:
        if len(parts) != 3:
            raise ValueError
        item_id = int(parts[1], 16)
        int(parts[2], 16)
    except ValueError:
        raise SqsError(
            "ReceiptHandleIsInvalid",
            f'The input receipt handle "{raw}" is not a valid receipt handle.',
        ) from None
    return handle, item_id


def _delete_error(o: ItemOutcome, handle: str, fifo_queue: bool) -> SqsError | None:
    if o.error is None or (o.error == "stale_receipt" and not fifo_queue):
        return None
    if o.error == "stale_receipt":
        return invalid("ReceiptHandle", handle, "The receipt handle has expired.")
    return SqsError(
        "ReceiptHandleIsInvalid",
        f'The input receipt handle "{handle}" is not a valid receipt handle.',
    )


def _visibility_error(o: ItemOutcome, handle: str) -> SqsError | None:
    if o.error is None:
        return None
    if o.error == "stale_receipt":
        return SqsError(
            "InvalidParameterValue",
            f"Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
            "exist or is not available for visibility timeout change.",
        )
    return SqsError(
        "ReceiptHandleIsInvalid",
        f'The input receipt handle "{handle}" is not a valid receipt handle.',
    )


async def _release(ctx: Ctx, name: str, batch: list[Release]) -> list[ItemOutcome]:
    ops = ctx.service.ops
    try:
        outcomes = await metered_durable(
            ctx.service, "release", lambda inline: ops.start_release(name, batch, inline)
        )
    except StorageError as exc:
        raise from_storage(exc, name) from None
    done = [(r, o) for r, o in zip(batch, outcomes, strict=True) if o.error is None]
    ctx.state.receives.forget(name, [o.id for _, o in done])
    ctx.state.attempts.changed(name, [r.receipt for r, _ in done])
    return outcomes


async def delete_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    handle, item_id = _handle(get_str(p, "ReceiptHandle", required=True))
    (o,) = await _release(ctx, name, [Release(item_id, handle)])
    refused = _delete_error(o, handle, fifo.is_fifo(name))
    if refused is not None:
        raise refused
    return {}


async def delete_message_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    entries = check_entries(p, ctx.limits.batch_entries)
    failures: list[dict[str, Any]] = []
    todo: list[tuple[str, str, Release]] = []
    for e in entries:
        try:
            handle, item_id = _handle(e.get("ReceiptHandle"))
        except SqsError as err:
            failures.append(failed(e["Id"], err))
            continue
        todo.append((e["Id"], handle, Release(item_id, handle)))
    outcomes = await _release(ctx, name, [r for _, _, r in todo]) if todo else []
    successful = []
    for (entry_id, handle, _), o in zip(todo, outcomes, strict=True):
        refused = _delete_error(o, handle, fifo.is_fifo(name))
        if refused is None:
            successful.append({"Id": entry_id})
        else:
            failures.append(failed(entry_id, refused))
    return {"Successful": successful, "Failed": failures}


async def _change(ctx: Ctx, name: str, changes: list[tuple[int, str, int]]) -> list[ItemOutcome]:
    """Apply (id, receipt, seconds) changes: extends, and requeues for 0 s; in order.

    On a FIFO queue, 0 s ends the lease as if it ran out (an extend to 1 ms, so the
    engine's lease expiry brings the message back): SQS makes it visible as the next of
    its group, and only an expired lease comes back ahead of its group's later items —
    a requeue due now would go behind them (``docs/delivery.md``)."""
    service = ctx.service
    ops = service.ops
    lease = [s > 0 or fifo.is_fifo(name) for _, _, s in changes]  # an extend, or a requeue
    extends: list[Extend] = []
    requeues: list[Requeue] = []
    for (i, r, s), e in zip(changes, lease, strict=True):
        if e:
            extends.append(Extend(i, r, max(1, s * 1000)))
        else:
            requeues.append(Requeue(i, r, delay_ms=0))
    t0 = _perf()
    try:
        extended = ops.extend(name, extends) if extends else []
        requeued = (
            await durable(service, lambda inline: ops.start_requeue(name, requeues, inline))
            if requeues
            else []
        )
    except StorageError as exc:
        service.metrics.observe_error("extend", exc.code, _perf() - t0)
        raise from_storage(exc, name) from None
    if extends:
        service.metrics.observe("extend", _perf() - t0, len(extended))
    if requeues:
        service.metrics.observe("requeue", _perf() - t0, len(requeued))
    ext, req = iter(extended), iter(requeued)
    outcomes = [next(ext) if e else next(req) for e in lease]
    done = (r for (_, r, _), o in zip(changes, outcomes, strict=True) if o.error is None)
    ctx.state.attempts.changed(name, done)
    return outcomes


async def change_message_visibility(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    handle, item_id = _handle(get_str(p, "ReceiptHandle", required=True))
    seconds = get_int(p, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
    if seconds is None:
        raise SqsError(
            "MissingParameter", "The request must contain the parameter VisibilityTimeout."
        )
    (o,) = await _change(ctx, name, [(item_id, handle, seconds)])
    refused = _visibility_error(o, handle)
    if refused is not None:
        raise refused
    return {}


async def change_message_visibility_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    entries = check_entries(p, ctx.limits.batch_entries)
    failures: list[dict[str, Any]] = []
    todo: list[tuple[str, str, int, int]] = []
    for e in entries:
        try:
            handle, item_id = _handle(e.get("ReceiptHandle"))
            seconds = get_int(e, "VisibilityTimeout", 0, MAX_VISIBILITY_S)
            if seconds is None:
                raise SqsError(
                    "MissingParameter", "The request must contain the parameter VisibilityTimeout."
                )
            todo.append((e["Id"], handle, item_id, seconds))
        except SqsError as err:
            failures.append(failed(e["Id"], err))
    outcomes = await _change(ctx, name, [(i, h, s) for _, h, i, s in todo]) if todo else []
    successful = []
    for (entry_id, handle, _, _), o in zip(todo, outcomes, strict=True):
        refused = _visibility_error(o, handle)
        if refused is None:
            successful.append({"Id": entry_id})
        else:
            failures.append(failed(entry_id, refused))
    return {"Successful": successful, "Failed": failures}
