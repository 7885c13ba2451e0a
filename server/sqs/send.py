"""SendMessage and SendMessageBatch: an SQS message becomes a dq item.

DelaySeconds (or the queue's ``DelaySeconds``) is the item's delay; a ``dq.Deadline``
Number attribute (ms since the epoch) gives an absolute deadline instead, with no
15-minute cap. ``MessageGroupId`` is the item's group, ``MessageDeduplicationId`` its
idempotency key (on a FIFO queue, the key ``dq.server.sqs.fifo`` derives); a group on
a standard queue makes it fair (``dq.server.sqs.fair``). Body and
attributes go into the item's value (``dq.server.sqs.messages``). A batch is one durable
engine write: its valid entries are all stored or none is. On a FIFO queue, what FIFO
refuses (no group, no deduplication id, a per-message delay) fails the whole batch, as
in SQS; other faults fail their entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from dq.server.calls import metered_durable
from dq.server.sqs import fifo
from dq.server.sqs.batches import check_entries, failed
from dq.server.sqs.context import Ctx
from dq.server.sqs.errors import SqsError, from_storage
from dq.server.sqs.fair import make_fair
from dq.server.sqs.messages import (
    DEADLINE_ATTRIBUTE,
    Stored,
    attributes_size,
    check_attributes,
    check_text,
    encode,
    md5_hex,
    md5_of_attributes,
    message_id,
)
from dq.server.sqs.names import queue_from_url
from dq.server.sqs.params import get_int, get_str, invalid
from dq.server.sqs.queue_attrs import DEFAULTS, stored_int
from dq.server.sqs.sidecar import Sidecar
from dq.storage.codec import MAX_DEADLINE
from dq.storage.errors import StorageError
from dq.storage.types import Enqueued, NewItem

__all__ = ["send_message", "send_message_batch"]


@dataclass(frozen=True, slots=True)
class _Target:
    """The queue a send writes to, as its messages are checked against it."""

    name: str
    sidecar: Sidecar
    fifo: bool


def _max_size(ctx: Ctx, sidecar: Sidecar) -> int:
    """The queue's MaximumMessageSize if set, else SQS's default or, relaxed, dq's."""
    if "MaximumMessageSize" in sidecar.attributes or not ctx.limits.relaxed:
        return stored_int(sidecar, "MaximumMessageSize")
    return ctx.limits.message_bytes


def _deadline(attrs: dict[str, dict[str, str]]) -> int | None:
    a = attrs.get(DEADLINE_ATTRIBUTE)
    if a is None:
        return None
    if not a["DataType"].startswith("Number"):
        raise SqsError("InvalidParameterValue", f"{DEADLINE_ATTRIBUTE} must be a Number attribute.")
    value = Decimal(a["StringValue"])
    if value != value.to_integral_value() or not 0 <= value <= MAX_DEADLINE:
        raise SqsError(
            "InvalidParameterValue",
            f"{DEADLINE_ATTRIBUTE} must be whole ms since the epoch, at most {MAX_DEADLINE}.",
        )
    return int(value)


def _check_fifo(target: _Target, entry: dict[str, Any], ctx: Ctx, *, batch: bool) -> None:
    """What a FIFO queue refuses of a message, in SQS's words: no group (in a batch,
    ``InvalidParameterValue`` for the whole request, as SQS answers), a per-message
    delay, no deduplication id without content-based deduplication."""
    if entry.get("MessageGroupId") is None:
        shape = "InvalidParameterValue" if batch else "MissingParameter"
        raise SqsError(shape, "The request must contain the parameter MessageGroupId.")
    delay = get_int(entry, "DelaySeconds", 0, ctx.limits.max_delay_s)
    if delay:  # 0 is allowed: it is no delay of its own (the queue's applies)
        raise invalid(
            "DelaySeconds",
            delay,
            "The request include parameter that is not valid for this queue type.",
        )
    fifo.check_dedup(target.sidecar.attributes, get_str(entry, "MessageDeduplicationId"))


def _ids(
    target: _Target, entry: dict[str, Any], body: str
) -> tuple[str | None, str | None, str | None]:
    """(group, idempotency key, deduplication id) of one message."""
    group = get_str(entry, "MessageGroupId")
    given = get_str(entry, "MessageDeduplicationId")
    if group is not None:
        fifo.check_id("MessageGroupId", group)
    if given is not None:
        fifo.check_id("MessageDeduplicationId", given)
    if not target.fifo:
        return group, given, given
    assert group is not None  # _check_fifo ran first
    key, dedup = fifo.dedup_key(target.sidecar.attributes, group, given, body)
    return group, key, dedup


def _prepare(ctx: Ctx, target: _Target, entry: dict[str, Any]) -> tuple[NewItem, dict[str, Any]]:
    """The item for one entry and its answer (without ``MessageId``), or raise."""
    sidecar = target.sidecar
    relaxed = ctx.limits.relaxed
    body = check_text(get_str(entry, "MessageBody", required=True), "the message body")
    if not body:
        raise SqsError("MissingParameter", "The request must contain the parameter MessageBody.")
    attrs = check_attributes(entry.get("MessageAttributes"), relaxed=relaxed)
    system = check_attributes(entry.get("MessageSystemAttributes"), system=True, relaxed=relaxed)
    limit = _max_size(ctx, sidecar)
    if len(body.encode()) + attributes_size(attrs) > limit:
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: Message must be shorter than {limit} bytes.",
        )
    # a FIFO message has no delay of its own (_check_fifo refused one): the queue's applies
    given = None if target.fifo else get_int(entry, "DelaySeconds", 0, ctx.limits.max_delay_s)
    deadline = _deadline(attrs)
    if deadline is not None and given:
        raise invalid("DelaySeconds", given, f"give either DelaySeconds or {DEADLINE_ATTRIBUTE}.")
    delay = (
        given
        if given is not None
        else int(sidecar.attributes.get("DelaySeconds", DEFAULTS["DelaySeconds"]))
    )
    group, key, dedup = _ids(target, entry, body)
    value = encode(Stored(body, attrs, system, dedup_id=dedup))
    stored_limit = ctx.service.settings.max_value_bytes
    if len(value) > stored_limit:  # relaxed: the envelope pushed it past dq's value limit
        raise SqsError(
            "InvalidParameterValue",
            f"One or more parameters are invalid. Reason: the message with its attributes "
            f"takes {len(value)} bytes as stored; the server's limit is {stored_limit}.",
        )
    when: dict[str, Any] = (
        {"deadline": deadline} if deadline is not None else {"delay_ms": delay * 1000}
    )
    item = NewItem(value, key=key, group=group, **when)
    answer: dict[str, Any] = {"MD5OfMessageBody": md5_hex(body.encode())}
    if attrs:
        answer["MD5OfMessageAttributes"] = md5_of_attributes(attrs)
    if system:
        answer["MD5OfMessageSystemAttributes"] = md5_of_attributes(system)
    return item, answer


async def _enqueue(ctx: Ctx, name: str, items: list[NewItem]) -> list[Enqueued]:
    ops = ctx.service.ops
    try:
        return await metered_durable(
            ctx.service, "enqueue", lambda inline: ops.start_enqueue(name, items, inline)
        )
    except StorageError as exc:
        raise from_storage(exc, name) from None


def _target(ctx: Ctx, name: str) -> _Target:
    try:
        sidecar = ctx.state.sidecars.load(ctx.engine, name)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    return _Target(name, sidecar, fifo.is_fifo(name))


def _turns_fair(target: _Target) -> bool:
    """A grouped message sent to this queue turns its ``fair`` rule on: a standard
    queue the SQS layer has not made fair before (``dq.server.sqs.fair``)."""
    return not target.fifo and target.sidecar.fair_since is None


def _sent(target: _Target, done: Enqueued) -> dict[str, str]:
    """The ids of a stored message (a duplicate's are the first message's, as SQS)."""
    ids = {"MessageId": message_id(target.name, done.id)}
    if target.fifo:
        ids["SequenceNumber"] = fifo.sequence_number(done.id)
    return ids


async def send_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    target = _target(ctx, queue_from_url(p.get("QueueUrl")))
    if target.fifo:
        _check_fifo(target, p, ctx, batch=False)
    item, answer = _prepare(ctx, target, p)
    if item.group is not None and _turns_fair(target):
        await make_fair(ctx, target.name)
    (done,) = await _enqueue(ctx, target.name, [item])
    return {**answer, **_sent(target, done)}


async def send_message_batch(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    entries = check_entries(p, ctx.limits.batch_entries)
    # counted before each entry's own checks: a body that is no valid text (a lone
    # surrogate) is counted as given here and refused as that entry's failure below
    total = sum(len(str(e.get("MessageBody", "")).encode(errors="surrogatepass")) for e in entries)
    if total > ctx.limits.batch_bytes:
        raise SqsError(
            "BatchRequestTooLong",
            f"Batch requests cannot be longer than {ctx.limits.batch_bytes} bytes. "
            f"You have sent {total} bytes.",
        )
    target = _target(ctx, name)
    if target.fifo:
        for e in entries:
            _check_fifo(target, e, ctx, batch=True)
    ok: list[tuple[str, dict[str, Any]]] = []
    items: list[NewItem] = []
    failures: list[dict[str, Any]] = []
    for e in entries:
        try:
            item, answer = _prepare(ctx, target, e)
        except SqsError as err:
            failures.append(failed(e["Id"], err))
            continue
        ok.append((e["Id"], answer))
        items.append(item)
    if _turns_fair(target) and any(i.group is not None for i in items):
        await make_fair(ctx, name)
    done = await _enqueue(ctx, name, items) if items else []
    successful = []
    for (entry_id, answer), enq in zip(ok, done, strict=True):
        successful.append({"Id": entry_id, **_sent(target, enq), **answer})
    return {"Successful": successful, "Failed": failures}
