"""The one error tree of the storage engine.

Every failure the engine reports is a ``StorageError``; the HTTP layer maps these
classes to status codes through one attribute, ``http_status``, declared here beside
each class (read by ``server/errors.py`` for the routes and the HTTP fast path, and by
anything else that answers in HTTP terms). Each error carries its context (queue, id,
file, offset) as attributes and a stable ``code`` string that clients can rely on.

    StorageError
    ├── InvalidArgument          bad input; nothing was written       (400/422)
    │   ├── BrokenRule           a field breaks a rule (validation_error, 422)
    │   │   └── OutOfRange       a field outside its range
    │   ├── InvalidQueueName
    │   ├── ValueTooLarge                                            (413)
    │   ├── InvalidDeadline
    │   ├── InvalidReceipt
    │   ├── InvalidKey           idempotency key not 1-128 bytes of UTF-8
    │   ├── BadCursor            a browse cursor that is not this queue's
    │   ├── NotADeadLetterQueue  redrive without "to" from a queue no one dead-letters to
    │   ├── InvalidSchedule      a schedule that cannot fire as given (names the field)
    │   └── BatchTooLarge                                            (413)
    ├── QueueNotFound                                                (404)
    ├── ItemNotFound             id was never assigned in this queue (404)
    ├── KeyNotFound              no item has this key within the dedup window (404)
    ├── ItemLeased               the item a key names is leased: not changed (409)
    ├── ScheduleNotFound         no schedule of that name on the queue (404)
    ├── StaleReceipt             that delivery is over               (409)
    ├── QueueExists / ConfigConflict                                 (409)
    ├── DataDirLocked            another process owns the directory (503)
    ├── CorruptionError          bad bytes, with file and offset     (500)
    ├── StorageFull              ENOSPC                              (507)
    ├── TooManyQueues            the engine's queue limit is reached  (507)
    ├── NotLeader            this node follows a replica group's leader (421)
    └── EngineUnavailable        closed, or failed after an I/O error (503)
        ├── QueueDamaged         quarantined at open: names file and offset (503)
        ├── WriteStall           segment files are behind: retry shortly (503)
        ├── ReplicationTimeout   the sync set did not acknowledge in time (503)
        └── ReplicationStalled   the sync set acknowledges nothing: refused, not written (503)
"""

from __future__ import annotations

__all__ = [
    "BadCursor",
    "BatchTooLarge",
    "BrokenRule",
    "ConfigConflict",
    "CorruptionError",
    "DataDirLocked",
    "EngineUnavailable",
    "InvalidArgument",
    "InvalidDeadline",
    "InvalidGroup",
    "InvalidKey",
    "InvalidQueueName",
    "InvalidReceipt",
    "InvalidSchedule",
    "ItemLeased",
    "ItemNotFound",
    "KeyNotFound",
    "NotADeadLetterQueue",
    "NotLeader",
    "OutOfRange",
    "QueueDamaged",
    "QueueNotFound",
    "ReplicationStalled",
    "ReplicationTimeout",
    "ScheduleNotFound",
    "StaleReceipt",
    "StorageError",
    "StorageFull",
    "TooManyQueues",
    "ValueTooLarge",
    "WriteStall",
    "status_for_code",
]


class StorageError(Exception):
    """Base of every error the engine raises."""

    code = "storage_error"
    #: The HTTP status this error answers with (subclasses narrow it).
    http_status = 500
    #: A condition of normal operation that the answer reports in full (a failover, a
    #: group short of members): a 5xx of such a class is logged as a warning, so that an
    #: ERROR in the server's log keeps meaning that something needs looking at.
    expected = False

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        if not self.context:
            return self.message
        details = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        return f"{self.message} ({details})"


class InvalidArgument(StorageError):
    code = "invalid_argument"
    http_status = 400


class BrokenRule(InvalidArgument):
    """A request field that breaks one of the rules ``storage/validation.py`` words once
    for every path (the words are the whole message); ``field`` names it. Answered as
    HTTP's schema refusals are: 422 ``validation_error``."""

    code = "validation_error"
    http_status = 422

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class OutOfRange(BrokenRule):
    """A field outside its range."""


class InvalidQueueName(InvalidArgument):
    code = "invalid_queue_name"


class ValueTooLarge(InvalidArgument):
    code = "value_too_large"
    http_status = 413


class InvalidDeadline(InvalidArgument):
    code = "invalid_deadline"


class InvalidReceipt(InvalidArgument):
    code = "invalid_receipt"


class InvalidKey(InvalidArgument):
    code = "invalid_key"


class InvalidGroup(InvalidArgument):
    code = "invalid_group"


class BadCursor(InvalidArgument):
    code = "bad_cursor"


class NotADeadLetterQueue(InvalidArgument):
    code = "not_a_dead_letter_queue"


class InvalidSchedule(InvalidArgument):
    """A schedule definition that cannot be kept as given: an unknown time zone, a cron
    expression that does not parse or never fires, an interval under the server's
    minimum... ``field`` (in ``context``) names what to fix."""

    code = "invalid_schedule"


class BatchTooLarge(InvalidArgument):
    code = "batch_too_large"
    http_status = 413


class QueueNotFound(StorageError):
    code = "queue_not_found"
    http_status = 404


class ItemNotFound(StorageError):
    code = "item_not_found"
    http_status = 404


class KeyNotFound(StorageError):
    """No item has this key within the queue's dedup window (the key was never used,
    its window ran out, or its item was cancelled by key)."""

    code = "key_not_found"
    http_status = 404


class ItemLeased(StorageError):
    """The item is leased: a consumer has it, so it is not changed by key (its receipt
    is what settles it)."""

    code = "item_leased"
    http_status = 409


class ScheduleNotFound(StorageError):
    code = "schedule_not_found"
    http_status = 404


class StaleReceipt(StorageError):
    code = "stale_receipt"
    http_status = 409


class ConfigConflict(StorageError):
    code = "config_conflict"
    http_status = 409


class DeadLetterQueueInUse(ConfigConflict):
    """A queue named as another queue's dead-letter queue was to be deleted without
    ``force``: its dead letters would go, and the next would silently start it anew."""

    code = "dead_letter_queue_in_use"


class DataDirLocked(StorageError):
    code = "data_dir_locked"
    http_status = 503


class CorruptionError(StorageError):
    """Bytes that fail a checksum or an invariant; ``context`` names file and offset."""

    code = "corruption"


class StorageFull(StorageError):
    code = "storage_full"
    http_status = 507


class EngineUnavailable(StorageError):
    code = "unavailable"
    http_status = 503


class TooManyQueues(StorageError):
    """Creating one more queue would pass ``EngineConfig.max_queues``."""

    code = "too_many_queues"
    http_status = 507


class QueueDamaged(EngineUnavailable):
    """The queue was found damaged when the engine opened it and is kept aside
    (quarantined); ``context`` names the file and offset. The other queues serve."""

    code = "queue_damaged"


class WriteStall(EngineUnavailable):
    """The log is far over its limit while segment files are written: retry shortly."""

    code = "write_stall"


class NotLeader(StorageError):
    """This node is a follower of a replica group: writes and dequeues go to the
    leader, whose URL is ``leader`` (None while no leader is known). Nothing was done,
    so the request may be sent to the leader as it is (``docs/replication.md``)."""

    code = "not_leader"
    http_status = 421

    def __init__(self, message: str, leader: str | None = None, **context: object) -> None:
        super().__init__(message, **context)
        self.leader = leader


class ReplicationTimeout(EngineUnavailable):
    """The write is durable on the leader but the replica group's sync set did not
    acknowledge it in time: its outcome is unknown (it still becomes visible if the
    acknowledgements come later). Retrying an enqueue may duplicate it; use a key."""

    code = "replication_timeout"
    expected = True


class ReplicationStalled(EngineUnavailable):
    """The replica group's sync set has acknowledged nothing for a whole commit
    timeout while writes wait: this write was refused before anything was written
    (a definite failure, safe to retry), so a leader cut off from its group does not
    pile up writes whose outcome it cannot know."""

    code = "replication_stalled"
    expected = True


def _codes(cls: type[StorageError]) -> dict[str, int]:
    table = {cls.code: cls.http_status}
    for sub in cls.__subclasses__():
        table.update(_codes(sub))
    return table


_STATUS_BY_CODE = _codes(StorageError)


def status_for_code(code: str) -> int:
    """The HTTP status of a storage error known only by its ``code`` (e.g. off a ring)."""
    return _STATUS_BY_CODE.get(code, 500)
