"""SQS errors in the shapes SDKs parse, and the mapping from storage errors to them.

An SQS error is HTTP 4xx/5xx with a JSON body ``{"__type": "com.amazonaws.sqs#<Shape>",
"message": text}`` and an ``x-amzn-query-error: <QueryCode>;Sender`` header. botocore
picks the exception class from the shape name (``QueueDoesNotExist`` ...) and reports the
query code as ``Error.Code`` (``AWS.SimpleQueueService.NonExistentQueue``), exactly as it
does against Amazon SQS. The query protocol answers the same error as XML with the query
code. Invariant: every refusal of the SQS endpoint is an ``SqsError``; nothing else leaks.
"""

from __future__ import annotations

from dq.storage.errors import (
    BatchTooLarge,
    EngineUnavailable,
    InvalidArgument,
    InvalidQueueName,
    NotLeader,
    QueueNotFound,
    StorageError,
    StorageFull,
    TooManyQueues,
    ValueTooLarge,
)

__all__ = ["SHAPES", "SqsError", "from_storage"]

#: shape name → (query error code, HTTP status). Shapes modeled by the SQS API first,
#: then the common errors every AWS service may answer.
SHAPES: dict[str, tuple[str, int]] = {
    "QueueDoesNotExist": ("AWS.SimpleQueueService.NonExistentQueue", 400),
    "QueueNameExists": ("QueueAlreadyExists", 400),
    "QueueDeletedRecently": ("AWS.SimpleQueueService.QueueDeletedRecently", 400),
    "ReceiptHandleIsInvalid": ("ReceiptHandleIsInvalid", 404),
    "MessageNotInflight": ("AWS.SimpleQueueService.MessageNotInflight", 400),
    "InvalidAttributeName": ("InvalidAttributeName", 400),
    "InvalidAttributeValue": ("InvalidAttributeValue", 400),
    "InvalidMessageContents": ("InvalidMessageContents", 400),
    "TooManyEntriesInBatchRequest": ("AWS.SimpleQueueService.TooManyEntriesInBatchRequest", 400),
    "EmptyBatchRequest": ("AWS.SimpleQueueService.EmptyBatchRequest", 400),
    "BatchEntryIdsNotDistinct": ("AWS.SimpleQueueService.BatchEntryIdsNotDistinct", 400),
    "BatchRequestTooLong": ("AWS.SimpleQueueService.BatchRequestTooLong", 400),
    "InvalidBatchEntryId": ("AWS.SimpleQueueService.InvalidBatchEntryId", 400),
    "PurgeQueueInProgress": ("AWS.SimpleQueueService.PurgeQueueInProgress", 403),
    "UnsupportedOperation": ("AWS.SimpleQueueService.UnsupportedOperation", 400),
    "ResourceNotFoundException": ("ResourceNotFoundException", 404),
    "InvalidAddress": ("InvalidAddress", 404),
    "OverLimit": ("OverLimit", 403),
    "RequestThrottled": ("RequestThrottled", 403),
    "InvalidParameterValue": ("InvalidParameterValue", 400),
    "MissingParameter": ("MissingParameter", 400),
    "InvalidAction": ("InvalidAction", 400),
    "MalformedQueryString": ("MalformedQueryString", 400),
    "SerializationException": ("SerializationException", 400),
    "MissingAuthenticationToken": ("MissingAuthenticationToken", 403),
    "IncompleteSignature": ("IncompleteSignature", 400),
    "SignatureDoesNotMatch": ("SignatureDoesNotMatch", 403),
    "InternalFailure": ("InternalFailure", 500),
    "ServiceUnavailable": ("ServiceUnavailable", 503),
}


class SqsError(Exception):
    """One SQS error: ``shape`` names the exception SDKs raise (a key of ``SHAPES``);
    ``leader``: a follower's leader, answered in the ``X-DQ-Leader`` header too."""

    def __init__(self, shape: str, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        if shape not in SHAPES:
            raise ValueError(f"unknown SQS error shape {shape!r}")
        self.shape = shape
        self.message = message
        self.leader = leader

    @property
    def code(self) -> str:
        """The query-protocol error code (``Error.Code`` in botocore)."""
        return SHAPES[self.shape][0]

    @property
    def status(self) -> int:
        return SHAPES[self.shape][1]

    @property
    def sender_fault(self) -> bool:
        return self.status < 500


def from_storage(exc: StorageError, queue: str | None = None) -> SqsError:
    """The SQS error for an engine refusal (most specific class first).

    A follower's refusal is ``ServiceUnavailable`` (503), which AWS SDKs retry: an SDK
    cannot be sent elsewhere, so the message and the ``X-DQ-Leader`` header name the
    leader for whoever reads them (``docs/sqs.md``, "Errors")."""
    if isinstance(exc, NotLeader):
        if exc.leader:
            return SqsError(
                "ServiceUnavailable",
                f"This node is a follower: send SQS requests to the leader, {exc.leader}.",
                leader=exc.leader,
            )
        return SqsError("ServiceUnavailable", "This node is a follower and no leader is known yet.")
    if isinstance(exc, QueueNotFound):
        return SqsError("QueueDoesNotExist", "The specified queue does not exist.")
    if isinstance(exc, InvalidQueueName):
        return SqsError("InvalidParameterValue", f"Invalid queue name {queue!r}: {exc.message}")
    if isinstance(exc, ValueTooLarge | BatchTooLarge | InvalidArgument):
        return SqsError("InvalidParameterValue", exc.message)
    if isinstance(exc, TooManyQueues):  # SQS's answer to a quota reached; not retried
        return SqsError("OverLimit", f"Cannot create queue {queue!r}: {exc.message}.")
    if isinstance(exc, StorageFull):
        return SqsError("ServiceUnavailable", "No space left on the server's data volume.")
    if isinstance(exc, EngineUnavailable):
        return SqsError("ServiceUnavailable", f"The queue engine is unavailable: {exc.message}")
    return SqsError("InternalFailure", f"{exc.code}: {exc.message}")
