"""SendMessage and SendMessageBatch: an SQS message becomes a dq item.

DelaySeconds (or the queue's ``DelaySeconds``) is the item's delay; a ``dq.Deadline``
Number attribute (ms since the epoch) gives an absolute deadline instead, with no
15-minute cap. ``MessageDeduplicationId`` is the item's idempotency key. Body and
attributes go into the item's value (``dq.server.sqs.messages``). A batch is one durable
engine write: its valid entries are all stored or none is.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from dq.server.calls import metered_durable
from dq.server.sqs.batches import check_entries, failed
from dq.server.sqs.context import Ctx
from dq.server.sqs.errors import SqsError, from_storage
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

_DEDUP_ID = re.compile(r"[!-~]{1,128}")


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


def _prepare(ctx: Ctx, sidecar: Sidecar, entry: dict[str, Any]) -> tuple[NewItem, dict[str, Any]]:
    """The item for one entry and its answer (without ``MessageId``), or raise."""
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
    given = get_int(entry, "DelaySeconds", 0, ctx.limits.max_delay_s)
    deadline = _deadline(attrs)
    if deadline is not None and given:
        raise invalid("DelaySeconds", given, f"give either DelaySeconds or {DEADLINE_ATTRIBUTE}.")
    delay = (
        given
        if given is not None
        else int(sidecar.attributes.get("DelaySeconds", DEFAULTS["DelaySeconds"]))
    )
    group = get_str(entry, "MessageGroupId")
    dedup = get_str(entry, "MessageDeduplicationId")
    for param, given_id in (("MessageGroupId", group), ("MessageDeduplicationId", dedup)):
        if given_id is not None and _DEDUP_ID.fullmatch(given_id) is None:
            raise invalid(param, given_id, "must be 1 to 128 printable ASCII characters.")
    value = encode(Stored(body, attrs, system, group, dedup))
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
    item = NewItem(value, **when) if dedup is None else NewItem(value, key=dedup, **when)
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


def _sidecar(ctx: Ctx, name: str) -> Sidecar:
    try:
        return ctx.state.sidecars.load(ctx.engine, name)
    except StorageError as exc:
        raise from_storage(exc, name) from None


async def send_message(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    sidecar = _sidecar(ctx, name)
    item, answer = _prepare(ctx, sidecar, p)
    (done,) = await _enqueue(ctx, name, [item])
    answer["MessageId"] = message_id(name, done.id)
    return answer


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
    sidecar = _sidecar(ctx, name)
    ok: list[tuple[str, dict[str, Any]]] = []
    items: list[NewItem] = []
    failures: list[dict[str, Any]] = []
    for e in entries:
        try:
            item, answer = _prepare(ctx, sidecar, e)
        except SqsError as err:
            failures.append(failed(e["Id"], err))
            continue
        ok.append((e["Id"], answer))
        items.append(item)
    done = await _enqueue(ctx, name, items) if items else []
    successful = []
    for (entry_id, answer), enq in zip(ok, done, strict=True):
        successful.append({"Id": entry_id, "MessageId": message_id(name, enq.id), **answer})
    return {"Successful": successful, "Failed": failures}
