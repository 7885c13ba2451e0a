"""Queue actions: create, find, list, delete, purge, attributes, tags, redrive tasks.

Config changes go to the engine (``put_queue``) and to the queue's SQS sidecar; both
are durable before the answer. ``CreateQueue`` of an existing queue answers its URL
when the attributes asked for match, and ``QueueNameExists`` when they do not, as SQS
does. Admin writes are serialized by one lock (they are rare; the sidecar is
read-modify-write).
"""

from __future__ import annotations

import asyncio
import base64
from dataclasses import replace
from typing import Any

from dq.server.sqs import fifo
from dq.server.sqs.context import Ctx
from dq.server.sqs.errors import SqsError, from_storage
from dq.server.sqs.messages import check_text
from dq.server.sqs.names import queue_from_arn, queue_from_url, valid_name
from dq.server.sqs.params import get_int, get_list, get_map, get_str, invalid
from dq.server.sqs.queue_attrs import apply, effective, render
from dq.server.sqs.sidecar import Sidecar
from dq.storage.errors import StorageError
from dq.storage.types import QueueConfig

__all__ = ["ACTIONS"]


def _existing(ctx: Ctx, p: dict[str, Any]) -> str:
    name = queue_from_url(p.get("QueueUrl"))
    try:
        ctx.engine.get_queue(name)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    return name


def _check_new_name(name: str | None) -> str:
    if not valid_name(name):
        raise SqsError(
            "InvalidParameterValue",
            "Can only include alphanumeric characters, hyphens, underscores and dots; "
            "1 to 128 in length (dq's queue names).",
        )
    assert name is not None
    return name


def _tags(raw: dict[str, Any]) -> dict[str, str]:
    """Tags as text every answer can carry (ListQueueTags in XML too)."""
    tags = {str(k): str(v) for k, v in raw.items()}
    for k, v in tags.items():
        check_text(k, "a tag key", "InvalidParameterValue")
        check_text(v, f"the tag {k}", "InvalidParameterValue")
    return tags


async def _save(ctx: Ctx, name: str, config: QueueConfig | None, sidecar: Sidecar) -> None:
    engine = ctx.engine
    try:
        if config is not None:
            await asyncio.to_thread(engine.put_queue, name, config)
        await asyncio.to_thread(ctx.state.sidecars.save, engine, name, sidecar)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    except FileNotFoundError:  # deleted meanwhile
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None


async def create_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _check_new_name(get_str(p, "QueueName", required=True))
    attrs = get_map(p, "Attributes")
    fifo.check_kind(name, {str(k): str(v) for k, v in attrs.items()})
    tags = _tags(get_map(p, "tags"))
    engine = ctx.engine
    async with ctx.state.admin_lock:
        if name in engine.list_queues():
            config = engine.get_queue(name)
            sidecar = ctx.state.sidecars.load(engine, name)
            new_config, new_sidecar = apply(ctx, name, attrs, config, sidecar)
            # a queue of that name made natively without the FIFO rule is another queue
            new_config = fifo.fifo_config(name, new_config)
            # compared as applied: asking again for a default (DelaySeconds=0) is no change
            seen = effective(name, sidecar, ctx.limits)
            if new_config != config or effective(name, new_sidecar, ctx.limits) != seen:
                raise SqsError(
                    "QueueNameExists",
                    f"A queue already exists with the same name and a different value for "
                    f"attribute(s) {', '.join(sorted(attrs))}.",
                )
            return {"QueueUrl": ctx.url(name)}
        fresh = fifo.fifo_config(name, QueueConfig())
        if fifo.is_fifo(name):  # SQS's deduplication interval, whatever dq's default
            fresh = replace(fresh, dedup_window_ms=fifo.DEDUP_WINDOW_MS)
        config, sidecar = apply(ctx, name, attrs, fresh, Sidecar())
        sidecar.tags = tags
        sidecar.created = sidecar.modified = engine.now() // 1000
        await _save(ctx, name, config, sidecar)
    return {"QueueUrl": ctx.url(name)}


async def get_queue_url(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = get_str(p, "QueueName", required=True)
    if not valid_name(name) or name not in ctx.engine.list_queues():
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    assert name is not None
    return {"QueueUrl": ctx.url(name)}


def _page(names: list[str], p: dict[str, Any], key: str, ctx: Ctx) -> dict[str, Any]:
    """One page of queue URLs: SQS pages only when ``MaxResults`` is given."""
    limit = get_int(p, "MaxResults", 1, 1000)
    token = get_str(p, "NextToken")
    if token:
        try:
            after = base64.urlsafe_b64decode(token.encode()).decode()
        except ValueError:
            raise invalid("NextToken", token, "not a token this server gave.") from None
        names = [n for n in names if n > after]
    out: dict[str, Any] = {}
    if limit is not None and len(names) > limit:
        names = names[:limit]
        out["NextToken"] = base64.urlsafe_b64encode(names[-1].encode()).decode()
    elif limit is None:
        names = names[:1000]
    if names:
        out[key] = [ctx.url(n) for n in names]
    return out


async def list_queues(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    prefix = get_str(p, "QueueNamePrefix") or ""
    names = [n for n in ctx.engine.list_queues() if n.startswith(prefix)]
    return _page(names, p, "QueueUrls", ctx)


async def delete_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    async with ctx.state.admin_lock:
        try:
            # SQS deletes a queue that is another's dead-letter queue (its redrive
            # policy then names a queue that is gone), and so does this endpoint
            await asyncio.to_thread(ctx.engine.delete_queue, name, force=True)
        except StorageError as exc:
            raise from_storage(exc, name) from None
        ctx.state.sidecars.forget(name)
        ctx.state.receives.forget_queue(name)
        ctx.state.attempts.forget_queue(name)
    return {}


async def purge_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    try:
        await asyncio.to_thread(ctx.engine.purge, name)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    ctx.state.receives.forget_queue(name)
    ctx.state.attempts.forget_queue(name)
    return {}


async def get_queue_attributes(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = queue_from_url(p.get("QueueUrl"))
    wanted = [str(n) for n in get_list(p, "AttributeNames")]
    try:
        stats = ctx.engine.stats(name)
        sidecar = ctx.state.sidecars.load(ctx.engine, name)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    attributes = render(ctx, name, wanted, stats, sidecar)
    return {"Attributes": attributes} if attributes else {}


async def set_queue_attributes(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    attrs = get_map(p, "Attributes")
    async with ctx.state.admin_lock:
        try:
            config = ctx.engine.get_queue(name)
            sidecar = ctx.state.sidecars.load(ctx.engine, name)
        except StorageError as exc:
            raise from_storage(exc, name) from None
        new_config, new_sidecar = apply(ctx, name, attrs, config, sidecar)
        new_sidecar.modified = ctx.engine.now() // 1000
        await _save(ctx, name, new_config if new_config != config else None, new_sidecar)
    return {}


def _sources(ctx: Ctx, dlq: str) -> list[str]:
    """The queues whose dead letters go to ``dlq``."""
    return ctx.engine.dead_letter_sources(dlq)


async def list_dead_letter_source_queues(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    out = _page(_sources(ctx, name), p, "queueUrls", ctx)
    out.setdefault("queueUrls", [])
    return out


async def tag_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    async with ctx.state.admin_lock:
        sidecar = ctx.state.sidecars.load(ctx.engine, name)
        sidecar.tags.update(_tags(get_map(p, "Tags")))
        await _save(ctx, name, None, sidecar)
    return {}


async def untag_queue(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    async with ctx.state.admin_lock:
        sidecar = ctx.state.sidecars.load(ctx.engine, name)
        for key in get_list(p, "TagKeys", required=True):
            sidecar.tags.pop(str(key), None)
        await _save(ctx, name, None, sidecar)
    return {}


async def list_queue_tags(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    name = _existing(ctx, p)
    tags = ctx.state.sidecars.load(ctx.engine, name).tags
    return {"Tags": tags} if tags else {}


def _arn_queue(ctx: Ctx, arn: object, parameter: str) -> str:
    name = queue_from_arn(arn, parameter)
    if name not in ctx.engine.list_queues():
        raise SqsError("ResourceNotFoundException", f"The resource {arn} does not exist.")
    return name


async def start_message_move_task(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    source_arn = get_str(p, "SourceArn", required=True)
    source = _arn_queue(ctx, source_arn, "SourceArn")
    destination_arn = get_str(p, "DestinationArn")
    destination = None
    if destination_arn is not None:
        destination = _arn_queue(ctx, destination_arn, "DestinationArn")
    rate = get_int(p, "MaxNumberOfMessagesPerSecond", 1, 500)
    engine = ctx.engine
    if not _sources(ctx, source):
        raise invalid(
            "SourceArn", source_arn, "Source queue must be configured as a Dead Letter Queue."
        )
    if ctx.state.moves.running(source) is not None:
        raise SqsError(
            "UnsupportedOperation", "There is already a message move task running for this queue."
        )
    pending = engine.stats(source).pending
    task = ctx.state.moves.start(
        engine, source, destination, (source_arn or "", destination_arn), rate, pending
    )
    return {"TaskHandle": task.handle}


async def list_message_move_tasks(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    source = _arn_queue(ctx, get_str(p, "SourceArn", required=True), "SourceArn")
    limit = get_int(p, "MaxResults", 1, 10, default=1) or 1
    results = []
    for t in ctx.state.moves.list(source)[:limit]:
        r: dict[str, Any] = {
            "Status": t.status,
            "SourceArn": t.source_arn,
            "ApproximateNumberOfMessagesMoved": t.moved,
            "ApproximateNumberOfMessagesToMove": t.to_move,
            "StartedTimestamp": t.started_ms,
        }
        if t.status == "RUNNING":
            r["TaskHandle"] = t.handle
        if t.destination_arn is not None:
            r["DestinationArn"] = t.destination_arn
        if t.rate is not None:
            r["MaxNumberOfMessagesPerSecond"] = t.rate
        if t.failure is not None:
            r["FailureReason"] = t.failure
        results.append(r)
    return {"Results": results}


async def cancel_message_move_task(ctx: Ctx, p: dict[str, Any]) -> dict[str, Any]:
    handle = get_str(p, "TaskHandle", required=True) or ""
    task = ctx.state.moves.find(handle)
    if task is None or task.status != "RUNNING":
        raise SqsError("ResourceNotFoundException", "The task does not exist or is not running.")
    task.cancel.set()
    task.status = "CANCELLING"
    return {"ApproximateNumberOfMessagesMoved": task.moved}


ACTIONS = {
    "CreateQueue": create_queue,
    "GetQueueUrl": get_queue_url,
    "ListQueues": list_queues,
    "DeleteQueue": delete_queue,
    "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes,
    "SetQueueAttributes": set_queue_attributes,
    "ListDeadLetterSourceQueues": list_dead_letter_source_queues,
    "TagQueue": tag_queue,
    "UntagQueue": untag_queue,
    "ListQueueTags": list_queue_tags,
    "StartMessageMoveTask": start_message_move_task,
    "ListMessageMoveTasks": list_message_move_tasks,
    "CancelMessageMoveTask": cancel_message_move_task,
}
