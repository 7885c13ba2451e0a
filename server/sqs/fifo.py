"""FIFO queues: what makes an SQS queue FIFO, and how its rules map onto dq.

A queue is FIFO when its name ends in ``.fifo``, as in SQS (whose own advice is to tell
a FIFO queue by its name), so the answer is the same on every node of a replica group
and for a queue created through the native API. SQS's FIFO rules map onto dq as:

    FifoQueue=true               the name ends in .fifo; the queue's group_limit is 1
                                 (``fifo_config``)
    MessageGroupId               the item's group (required on send)
    ordering, a group held       group_limit=1: the engine's delivery rules
    MessageDeduplicationId       the item's idempotency key, remembered for the
      / ContentBasedDeduplication  queue's dedup_window_ms (5 minutes, as SQS)
    DeduplicationScope           queue: the key is the id; messageGroup: the key
                                 names the group too (``dedup_key``)
    SequenceNumber               the item id (``sequence_number``)

This module only maps: which message is held, and when, is the engine's rule
(``storage/_delivery.c``), kept for every front end alike. What FIFO refuses (a message
without a group, a per-message delay, a message without a deduplication id) is refused
here with SQS's own errors. The FIFO attributes ``ContentBasedDeduplication``,
``DeduplicationScope`` and ``FifoThroughputLimit`` live in the queue's sidecar
(``sqs.json``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace

from dq.server.sqs.errors import SqsError
from dq.storage.types import QueueConfig

__all__ = [
    "ATTRIBUTES",
    "DEDUP_WINDOW_MS",
    "DEFAULTS",
    "SEQUENCE_BASE",
    "check_attribute",
    "check_dedup",
    "check_id",
    "check_kind",
    "dedup_key",
    "fifo_config",
    "is_fifo",
    "sequence_number",
]

SUFFIX = ".fifo"
#: SQS's deduplication interval, 5 minutes: a FIFO queue's ``dedup_window_ms``.
DEDUP_WINDOW_MS = 300_000
#: The FIFO attributes kept in the sidecar, with the values SQS gives a new FIFO queue.
DEFAULTS = {
    "ContentBasedDeduplication": "false",
    "DeduplicationScope": "queue",
    "FifoThroughputLimit": "perQueue",
}
#: Every FIFO attribute ``GetQueueAttributes`` answers for a FIFO queue.
ATTRIBUTES = ("FifoQueue", *DEFAULTS)
_VALUES = {
    "ContentBasedDeduplication": ("true", "false"),
    "DeduplicationScope": ("messageGroup", "queue"),
    "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
}
#: A sequence number is this plus the item id: 20 decimal digits for every 64-bit id,
#: so sequence numbers compare alike as numbers and as text.
SEQUENCE_BASE = 10**19
_IDS = re.compile(r"[!-~]{1,128}")


def is_fifo(name: str) -> bool:
    return name.endswith(SUFFIX)


def check_id(parameter: str, value: str) -> str:
    """A ``MessageGroupId``, ``MessageDeduplicationId`` or ``ReceiveRequestAttemptId``:
    1 to 128 characters, letters, digits and punctuation."""
    if _IDS.fullmatch(value) is None:
        raise SqsError(
            "InvalidParameterValue",
            f"Value {value} for parameter {parameter} is invalid. Reason: {parameter} can "
            "only include alphanumeric and punctuation characters. 1 to 128 in length.",
        )
    return value


def check_kind(name: str, attributes: dict[str, str]) -> None:
    """A new queue's name and its ``FifoQueue`` attribute agree (SQS's errors if not)."""
    asked = attributes.get("FifoQueue")
    if is_fifo(name):
        if asked is None or asked.lower() != "true":
            raise SqsError(
                "InvalidParameterValue",
                "Can only include alphanumeric characters, hyphens, underscores and dots; "
                "1 to 128 in length (dq's queue names). A name ending in .fifo is a FIFO "
                "queue's: create it with the attribute FifoQueue set to true.",
            )
    elif asked is not None and asked.lower() == "true":
        raise SqsError(
            "InvalidParameterValue",
            "The name of a FIFO queue can only include alphanumeric characters, hyphens, "
            "underscores and dots, must end with .fifo suffix and be 1 to 128 in length.",
        )


def fifo_config(name: str, config: QueueConfig) -> QueueConfig:
    """``config`` with what makes queue ``name`` FIFO in the engine: its groups' items
    one at a time, in order (``group_limit`` 1; ``docs/delivery.md``)."""
    return replace(config, group_limit=1) if is_fifo(name) else config


def check_attribute(name: str, key: str, value: str) -> str | None:
    """The value to keep for FIFO attribute ``key`` of queue ``name``, or None for
    ``FifoQueue`` (which the name says); SQS's errors for what it refuses."""
    if not is_fifo(name):
        if key in ("DeduplicationScope", "FifoThroughputLimit"):
            raise SqsError(
                "InvalidAttributeName",
                f"You can specify the {key} only when FifoQueue is set to true.",
            )
        raise SqsError("InvalidAttributeName", f"Unknown Attribute {key}.")
    if key == "FifoQueue":
        if value.lower() != "true":
            raise SqsError(
                "InvalidAttributeValue",
                "Invalid value for the parameter FifoQueue. Reason: Modifying queue type is "
                "not supported.",
            )
        return None
    allowed = _VALUES[key]
    kept = value.lower() if key == "ContentBasedDeduplication" else value
    if kept not in allowed:
        raise SqsError(
            "InvalidAttributeValue",
            f"Invalid value for the parameter {key}. Reason: must be {' or '.join(allowed)}.",
        )
    return kept


def check_dedup(attributes: dict[str, str], given: str | None) -> None:
    """A FIFO message has a deduplication id: given, or made from its body."""
    if given is None and attributes.get("ContentBasedDeduplication", "false") != "true":
        raise SqsError(
            "InvalidParameterValue",
            "The queue should either have ContentBasedDeduplication enabled or "
            "MessageDeduplicationId provided explicitly",
        )


def dedup_key(
    attributes: dict[str, str], group: str, given: str | None, body: str
) -> tuple[str, str]:
    """(the item's idempotency key, the message's deduplication id) of a FIFO message.

    The deduplication id is the one given, else the SHA-256 of the body (hex) with
    ``ContentBasedDeduplication``; without either, SQS's refusal. With
    ``DeduplicationScope`` ``messageGroup`` the same id in two groups is two messages:
    the key is then the SHA-256 of the group's length, the group and the id (hex), as
    a group and an id together may be longer than a key."""
    check_dedup(attributes, given)
    dedup = given if given is not None else hashlib.sha256(body.encode()).hexdigest()
    if attributes.get("DeduplicationScope", "queue") != "messageGroup":
        return dedup, dedup
    scoped = f"{len(group)}:{group}{dedup}".encode()
    return hashlib.sha256(scoped).hexdigest(), dedup


def sequence_number(item_id: int) -> str:
    """A message's ``SequenceNumber``: its item id, which is strictly increasing per
    queue and kept through redeliveries, as a 20-digit decimal like SQS's."""
    return str(SEQUENCE_BASE + item_id)
