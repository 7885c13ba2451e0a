"""Queue attributes: which SQS attribute is which dq field, checked and rendered.

    VisibilityTimeout                 engine config: default_lease_ms
    RedrivePolicy                     engine config: max_deliveries, dead_letter_queue
    ApproximateNumberOfMessages*      engine stats: due / leased / delayed
    DelaySeconds, MaximumMessageSize,
    ReceiveMessageWaitTimeSeconds     sidecar (sqs.json), applied by the SQS layer
    MessageRetentionPeriod, Policy,
    RedriveAllowPolicy                sidecar, stored and returned, not enforced
    CreatedTimestamp, LastModified..  sidecar
    QueueArn                          derived from the name
    FifoQueue                         the name (ends in .fifo: ``dq.server.sqs.fifo``)
    ContentBasedDeduplication,
    DeduplicationScope,
    FifoThroughputLimit               sidecar, FIFO queues only (``dq.server.sqs.fifo``)

Server-side encryption is refused rather than stored: dq does not do it, and storing
it would claim it does (docs/sqs.md, "Not supported").
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dq.server.sqs import fifo
from dq.server.sqs.errors import SqsError
from dq.server.sqs.messages import check_text
from dq.server.sqs.names import queue_from_arn
from dq.storage.operations import effective_dead_letter_queue
from dq.storage.types import QueueConfig, QueueStats

if TYPE_CHECKING:
    from dq.server.sqs.context import Ctx, Limits
    from dq.server.sqs.sidecar import Sidecar

__all__ = ["ALL", "apply", "effective", "render", "stored_int"]

#: Sidecar attributes with the value SQS gives a new queue.
DEFAULTS = {
    "DelaySeconds": "0",
    "MaximumMessageSize": "262144",
    "MessageRetentionPeriod": "345600",
    "ReceiveMessageWaitTimeSeconds": "0",
}
_FREE_FORM = ("Policy", "RedriveAllowPolicy")
_READ_ONLY = (
    "QueueArn",
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
    "CreatedTimestamp",
    "LastModifiedTimestamp",
)
_ENGINE = ("VisibilityTimeout", "RedrivePolicy")
_REFUSED = ("KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds")
#: Every attribute ``All`` returns, in SQS's order (a FIFO queue's come last).
ALL = (*_READ_ONLY, *_ENGINE, *DEFAULTS, *_FREE_FORM, "SqsManagedSseEnabled", *fifo.ATTRIBUTES)


def effective(name: str, sidecar: Sidecar, limits: Limits) -> dict[str, str]:
    """The sidecar attributes as applied: the stored ones, else their defaults (a FIFO
    queue's too). With ``DQ_SQS_RELAXED``, a queue that sets no ``MaximumMessageSize``
    takes dq's value limit (what ``SendMessage`` applies), not SQS's 256 KiB."""
    defaults = DEFAULTS
    if limits.relaxed:
        defaults = {**DEFAULTS, "MaximumMessageSize": str(limits.message_bytes)}
    if fifo.is_fifo(name):
        defaults = {**defaults, **fifo.DEFAULTS}
    return {**defaults, **sidecar.attributes}


def stored_int(sidecar: Sidecar, name: str) -> int:
    return int(sidecar.attributes.get(name, DEFAULTS[name]))


def _ranges(limits: Limits) -> dict[str, tuple[int, int]]:
    return {
        "DelaySeconds": (0, limits.max_delay_s),
        "MaximumMessageSize": (1024, limits.message_bytes),
        "MessageRetentionPeriod": (60, limits.max_retention_s),
        "ReceiveMessageWaitTimeSeconds": (0, limits.max_wait_s),
        "VisibilityTimeout": (0, 12 * 3600),
    }


def _int_value(name: str, raw: str, lo: int, hi: int) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = None
    if value is None or not lo <= value <= hi:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {name}. Reason: must be an integer "
            f"between {lo} and {hi}.",
        )
    return value


def _redrive(ctx: Ctx, name: str, raw: str, config: QueueConfig) -> QueueConfig:
    if raw == "":
        return replace(config, max_deliveries=None, dead_letter_queue=None)
    try:
        policy = json.loads(raw)
        arn = policy["deadLetterTargetArn"]
        given = policy["maxReceiveCount"]
        if isinstance(given, bool | float):  # 2.7 is no count (int() would make it 2)
            raise TypeError(given)
        count = int(given)
    except (ValueError, KeyError, TypeError):
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: a JSON object with "
            "deadLetterTargetArn and maxReceiveCount is required.",
        ) from None
    dlq = queue_from_arn(arn, "RedrivePolicy")
    if fifo.is_fifo(dlq) != fifo.is_fifo(name):
        raise SqsError(
            "InvalidAttributeValue",
            f"Value {raw} for parameter RedrivePolicy is invalid. Reason: the dead-letter "
            "queue of a FIFO queue must be a FIFO queue, and of a standard queue a "
            "standard queue.",
        )
    if not 1 <= count <= 1000:
        raise SqsError(
            "InvalidAttributeValue",
            "Value for parameter RedrivePolicy is invalid. Reason: maxReceiveCount must be "
            "between 1 and 1000.",
        )
    if dlq == name or dlq not in ctx.engine.list_queues():
        raise SqsError(
            "InvalidAttributeValue",
            f"Value {raw} for parameter RedrivePolicy is invalid. Reason: Dead letter target "
            "does not exist.",
        )
    return replace(config, max_deliveries=count, dead_letter_queue=dlq)


def apply(
    ctx: Ctx, name: str, changes: dict[str, Any], config: QueueConfig, sidecar: Sidecar
) -> tuple[QueueConfig, Sidecar]:
    """The config and sidecar with ``changes`` applied; nothing is written here."""
    ranges = _ranges(ctx.limits)
    out = sidecar.copy()
    for key, raw in changes.items():
        value = raw if isinstance(raw, str) else str(raw)
        if key in fifo.ATTRIBUTES:
            kept = fifo.check_attribute(name, key, value)
            if kept is not None:
                out.attributes[key] = kept
        elif key in _REFUSED:
            raise SqsError("UnsupportedOperation", f"{key}: dq does not encrypt queues.")
        elif key == "SqsManagedSseEnabled":
            if value.lower() != "false":
                raise SqsError(
                    "UnsupportedOperation", "SqsManagedSseEnabled: dq does not encrypt queues."
                )
        elif key == "VisibilityTimeout":
            seconds = _int_value(key, value, *ranges[key])
            config = replace(config, default_lease_ms=max(1, seconds * 1000))
        elif key == "RedrivePolicy":
            config = _redrive(ctx, name, value, config)
        elif key in DEFAULTS:
            out.attributes[key] = str(_int_value(key, value, *ranges[key]))
        elif key in _FREE_FORM:
            if value == "":
                out.attributes.pop(key, None)
            else:  # stored, and returned in XML answers too: text only
                out.attributes[key] = check_text(value, key, "InvalidAttributeValue")
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
    return config, out


def render(
    ctx: Ctx, name: str, wanted: list[str], stats: QueueStats, sidecar: Sidecar
) -> dict[str, str]:
    names: list[str] = []
    for w in wanted:
        if w == "All":
            names.extend(ALL)
        elif w in ALL or w in _REFUSED:
            names.append(w)
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {w}.")
    config = stats.config
    values: dict[str, str | None] = {
        "QueueArn": ctx.arn(name),
        "ApproximateNumberOfMessages": str(stats.due),
        "ApproximateNumberOfMessagesNotVisible": str(stats.leased),
        "ApproximateNumberOfMessagesDelayed": str(stats.delayed),
        "CreatedTimestamp": None if sidecar.created is None else str(sidecar.created),
        "LastModifiedTimestamp": None if sidecar.modified is None else str(sidecar.modified),
        "VisibilityTimeout": str(config.default_lease_ms // 1000),
        "RedrivePolicy": None,
        "SqsManagedSseEnabled": "false",
        **effective(name, sidecar, ctx.limits),
        **{k: sidecar.attributes.get(k) for k in _FREE_FORM},
        "FifoQueue": "true" if fifo.is_fifo(name) else None,
    }
    dlq = effective_dead_letter_queue(name, config)
    if dlq is not None and config.max_deliveries is not None:
        values["RedrivePolicy"] = json.dumps(
            {"deadLetterTargetArn": ctx.arn(dlq), "maxReceiveCount": config.max_deliveries},
            separators=(",", ":"),
        )
    return {n: v for n in dict.fromkeys(names) if (v := values.get(n)) is not None}
