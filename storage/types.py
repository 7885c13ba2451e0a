"""Plain value types that cross the engine's public surface.

They carry no behaviour; the engine, the HTTP layer, the shared-memory server and
the client all speak in these. Times are integers, milliseconds since the epoch.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Literal

from dq.storage.errors import InvalidQueueName
from dq.storage.moved import MovedTo
from dq.storage.reasons import Reason
from dq.storage.retry import RetryPolicy

__all__ = [
    "MAX_QUEUE_NAME",
    "ON_DUPLICATE",
    "QUEUE_NAME_PATTERN",
    "BrowsePage",
    "BrowsedItem",
    "DeadEntry",
    "Delivery",
    "Enqueued",
    "Extend",
    "Fail",
    "FsyncMode",
    "GroupFigures",
    "ItemOutcome",
    "ItemStats",
    "NewItem",
    "OnDuplicate",
    "QueueConfig",
    "QueueStats",
    "RateLimit",
    "Reason",
    "RedriveResult",
    "Release",
    "Requeue",
    "check_queue_name",
    "default_dead_letter_queue",
]

FsyncMode = Literal["always", "interval", "never"]
#: what an enqueue whose key names a pending item does: answer it ("keep") or give it
#: the new value and deadline ("replace")
OnDuplicate = Literal["keep", "replace"]
ON_DUPLICATE = ("keep", "replace")

MAX_QUEUE_NAME = 128
QUEUE_NAME_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,128}")


def default_dead_letter_queue(name: str) -> str:
    """``<name>.dlq``; for a name too long for that, a shortened name with a hash of the
    whole, so it is never the queue itself (a poison item would cycle forever)."""
    candidate = f"{name}.dlq"
    if len(candidate) <= MAX_QUEUE_NAME:
        return candidate
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_QUEUE_NAME - 13]}.{digest}.dlq"


def check_queue_name(name: str) -> str:
    """Return ``name`` if it is a valid queue name, else raise ``InvalidQueueName``.

    Names starting with a dot belong to the engine (a deleted queue's directory is
    renamed ``.deleted-…`` and erased at the next start), so no queue may take one.
    """
    if (
        not isinstance(name, str)
        or QUEUE_NAME_PATTERN.fullmatch(name) is None
        or name.startswith(".")
    ):
        raise InvalidQueueName(
            "queue names match [A-Za-z0-9._-]{1,128} and do not start with '.'", queue=name
        )
    return name


@dataclass(slots=True)
class ItemStats:
    """Stats(128) of the storage design (docs/format.md): when the item was enqueued, last
    requeued, and how often delivered."""

    enqueue_time: int
    requeue_time: int
    dequeue_count: int


@dataclass(frozen=True, slots=True)
class NewItem:
    """What a producer hands in. ``deadline`` and ``delay_ms`` are exclusive; neither means now.

    ``key`` (1-128 bytes of UTF-8) makes the enqueue idempotent: within the queue's
    ``dedup_window_ms`` a repeat answers the first item's id and deadline, writes nothing
    (``on_duplicate`` "keep", the default); with "replace" a repeat whose item is still
    pending gives that item this value and deadline instead (``docs/retries.md``).
    ``group`` (1-128 printable ASCII characters) is the item's group, which the queue's
    delivery rules go by (``docs/delivery.md``).
    """

    value: bytes
    deadline: int | None = None
    delay_ms: int | None = None
    key: str | None = None
    group: str | None = None
    on_duplicate: OnDuplicate = "keep"


@dataclass(slots=True)
class Enqueued:
    """The id the server assigned and the deadline the item was stored with.

    ``duplicate``: the item's key was seen within the dedup window; id and deadline are
    the item's it names, and nothing was written. ``replaced``: the key's item was
    pending and now has this enqueue's value and deadline (``on_duplicate`` "replace")."""

    id: int
    deadline: int
    duplicate: bool = False
    replaced: bool = False


#: an entry on its way to a dead-letter queue: (key, stats, value, its item's group)
DeadEntry = tuple[bytes, bytes, bytes, str | None]


@dataclass(slots=True)
class Delivery:
    """One delivery of one item to a consumer, named by its receipt. ``last_error`` and
    ``last_error_at``: why and when the item last failed (a fail's error, or "lease
    expired"), None if it never did."""

    id: int
    receipt: str
    value: bytes
    deadline: int
    stats: ItemStats
    lease_expires: int
    #: the item's group (``docs/delivery.md``), None if it has none
    group: str | None = None
    last_error: str | None = None
    last_error_at: int | None = None


@dataclass(frozen=True, slots=True)
class Release:
    id: int
    receipt: str


@dataclass(frozen=True, slots=True)
class Requeue:
    id: int
    receipt: str
    deadline: int | None = None
    delay_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """Hand a leased item back under the queue's retry policy, saying why it failed
    (``error``: up to 4 KiB of UTF-8, kept with the item)."""

    id: int
    receipt: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class Extend:
    id: int
    receipt: str
    lease_ms: int


@dataclass(slots=True)
class ItemOutcome:
    """Per-item result of a batch release/requeue/extend.

    ``error`` is ``None`` on success, else a stable code (``stale_receipt``,
    ``item_not_found``, ``invalid_receipt``, ...) with ``message`` for humans.
    """

    id: int
    error: str | None = None
    message: str | None = None
    receipt: str | None = None
    deadline: int | None = None
    lease_expires: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket over a queue's deliveries (``docs/delivery.md``): it holds up to
    ``burst`` tokens, gains ``per_second`` a second, and each delivery takes one; with
    ``per_group`` every group (and the items without one, together) has its own."""

    per_second: float
    burst: int
    per_group: bool = False


@dataclass(frozen=True, slots=True)
class GroupFigures:
    """One group's figures for operators (``Operations.groups``, ``docs/delivery.md``)."""

    group: str | None
    leased: int
    #: due items the cursor passed that the group has not handed out
    waiting: int
    #: ``waiting`` items the group may not hand out now (a limit, its rate, order)
    held: int


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """Per-queue settings, persisted in the queue's directory. The last four are the
    delivery rules (``docs/delivery.md``, ``storage/_delivery.c``)."""

    default_lease_ms: int = 30_000
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    #: how long an idempotency key is remembered after its enqueue (0: keys are ignored)
    dedup_window_ms: int = 300_000
    #: the next deadline of a failed item or an expired lease (None: due again at once)
    retry: RetryPolicy | None = None
    #: at most this many items of one group leased at once (1: each group is FIFO)
    group_limit: int | None = None
    #: at most this many items of the queue leased at once
    leased_limit: int | None = None
    #: serve the groups that have due items in turn
    fair: bool = False
    #: a token bucket over deliveries, for the queue or for each group
    rate_limit: RateLimit | None = None

    @property
    def has_rules(self) -> bool:
        """Some delivery rule is set: dequeue goes through the delivery index."""
        return (
            self.group_limit is not None
            or self.leased_limit is not None
            or self.fair
            or self.rate_limit is not None
        )


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Live figures for one queue, exact (``storage/state_counts.py``): ``pending`` =
    ``due`` + ``delayed`` + ``leased`` but for the instant a release or requeue is
    being written (its item is still pending, no longer leased)."""

    name: str
    config: QueueConfig
    pending: int
    due: int
    delayed: int
    leased: int
    segments: int
    bytes_on_disk: int
    oldest_due_age_ms: int | None
    next_id: int
    extra: dict[str, int] = field(default_factory=dict)
    paused: bool = False
    paused_since: int | None = None
    #: items moved out of this queue to its dead-letter queue since the server started
    dead_lettered: int = 0
    #: leases that ran out (the item went back to the queue) since the server started
    lease_expired: int = 0
    #: age of the oldest live lease, from its dequeue (extends do not reset it)
    oldest_lease_age_ms: int | None = None
    #: items per second over the last minute
    enqueue_per_s: float = 0.0
    dequeue_per_s: float = 0.0
    release_per_s: float = 0.0
    #: the dead-letter queue this queue's items go to (None without max_deliveries)
    dead_letter_queue: str | None = None
    #: groups with a leased or a held item (``docs/delivery.md``)
    groups: int = 0
    #: due items the delivery rules hold back now (a gauge)
    held: int = 0
    #: deliveries the rate limit refused since the server started
    rate_limited: int = 0


ItemState = Literal["due", "delayed", "leased", "gone"]


@dataclass(slots=True)
class BrowsedItem:
    """One item seen without leasing it (browse, peek).

    ``state`` "gone": the id was assigned in this queue but the item is no longer there
    (released, deleted, purged, moved); then ``deadline`` and ``stats`` are None, and
    ``moved_to`` says where a dead-lettered or redriven item went while the server
    remembers the move (``storage/moved.py``)."""

    id: int
    deadline: int | None
    state: ItemState
    stats: ItemStats | None
    value_size: int
    value: bytes | None = None
    lease_expires: int | None = None
    dead_lettered_from: str | None = None
    moved_to: MovedTo | None = None
    group: str | None = None
    #: why the item failed, newest first (``storage/reasons.py``); None: it never did
    errors: tuple[Reason, ...] | None = None


@dataclass(slots=True)
class BrowsePage:
    """A page of a browse; ``next`` is the cursor of the next page (None at the end).

    A page may hold fewer items than asked for while ``next`` is not None: a browse
    stops after looking at a bounded number of entries."""

    items: list[BrowsedItem]
    next: str | None


@dataclass(slots=True)
class RedriveResult:
    """What a redrive moved, where to, and the items it could not move (and why)."""

    moved: int
    to: list[str]
    failed: list[ItemOutcome]
