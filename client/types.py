"""The client's value types: what you hand in and what comes back.

Plain frozen dataclasses, independent of the server's packages, so a transport can
build them from JSON (HTTP) or from ring slots (shared memory). Times are integers,
ms since the epoch; values are ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "BackupResult",
    "BrowsePage",
    "BrowsedItem",
    "Dequeued",
    "Enqueued",
    "Extend",
    "Fail",
    "GroupInfo",
    "Item",
    "ItemStats",
    "MovedTo",
    "NewItem",
    "Outcome",
    "QueueConfig",
    "QueueInfo",
    "QueueStats",
    "RateLimit",
    "Reason",
    "RedriveResult",
    "Release",
    "Requeue",
    "RetryPolicy",
]


@dataclass(frozen=True, slots=True)
class NewItem:
    """An item to enqueue; ``deadline`` and ``delay_ms`` are exclusive, neither means now.

    ``key`` (1-128 bytes of text) makes the enqueue idempotent: within the queue's
    ``dedup_window_ms`` a repeat answers the first item (``Enqueued.duplicate``) and
    writes nothing, so a batch whose items all have keys is retried after a lost answer.
    ``group`` (1-128 printable ASCII characters) is the item's group, which the queue's
    delivery rules go by (``docs/delivery.md``). ``on_duplicate`` "replace": a repeat of
    a key whose item is pending gives that item this value and deadline instead
    (``Enqueued.replaced``; debounce, ``docs/retries.md``).
    """

    value: bytes
    deadline: int | None = None
    delay_ms: int | None = None
    key: str | None = None
    group: str | None = None
    on_duplicate: str = "keep"


@dataclass(frozen=True, slots=True)
class Enqueued:
    id: int
    deadline: int
    #: the key was seen within the window: the first item's id and deadline, nothing written
    duplicate: bool = False
    #: on_duplicate "replace": the key's pending item got this value and deadline
    replaced: bool = False


@dataclass(frozen=True, slots=True)
class ItemStats:
    enqueue_time: int
    requeue_time: int
    dequeue_count: int


@dataclass(frozen=True, slots=True)
class Item:
    """One delivery of one item; ``receipt`` names this delivery only. ``last_error``
    and ``last_error_at``: why and when its previous delivery failed (a fail's error, or
    "lease expired"); None if it never failed."""

    id: int
    receipt: str
    value: bytes
    deadline: int
    stats: ItemStats
    lease_expires: int
    #: the item's group (``docs/delivery.md``); None: it has none
    group: str | None = None
    last_error: str | None = None
    last_error_at: int | None = None


class Dequeued(list[Item]):
    """What ``dequeue`` returns: the leased items (it is a list of them); in
    ``released``, one ``Outcome`` per release the request carried, in order; and
    ``queue_exists``, false when the queue does not exist — nobody created it yet, or
    its name is misspelled: a worker may start before its producer, but should say so."""

    __slots__ = ("queue_exists", "released")

    def __init__(
        self, items: list[Item], released: list[Outcome] | None = None, queue_exists: bool = True
    ) -> None:
        super().__init__(items)
        self.released: list[Outcome] = released if released is not None else []
        self.queue_exists = queue_exists


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
    """An item that failed: back under its queue's retry policy, ``error`` (up to 4096
    bytes of UTF-8) kept with it."""

    id: int
    receipt: str
    error: str = ""


@dataclass(frozen=True, slots=True)
class Extend:
    id: int
    receipt: str
    lease_ms: int


@dataclass(frozen=True, slots=True)
class Outcome:
    """Per-item result of release/requeue/extend; ``error`` is a server code when not ``ok``."""

    id: int
    ok: bool
    error: str | None = None
    message: str | None = None
    receipt: str | None = None
    deadline: int | None = None
    lease_expires: int | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """A queue's retry policy (``docs/retries.md``): exponential — ``initial_ms``, then
    each delay ``multiplier`` times the last, at most ``max_ms``, up to ``jitter`` (0..1)
    of it taken off at random — or ``delays_ms``, a list whose last delay repeats."""

    initial_ms: int | None = None
    multiplier: float = 2.0
    max_ms: int = 3_600_000
    jitter: float = 0.0
    delays_ms: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """A token bucket over a queue's deliveries: up to ``burst`` at once, ``per_second``
    on average; with ``per_group`` each group has its own (``docs/delivery.md``)."""

    per_second: float
    burst: int
    per_group: bool = False


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """A queue's settings. The delivery rules (``docs/delivery.md``): ``group_limit``
    (at most so many items of one group leased at once; 1: each group is FIFO),
    ``leased_limit`` (of the queue), ``fair`` (groups served in turn), ``rate_limit``."""

    default_lease_ms: int = 30_000
    max_deliveries: int | None = None
    dead_letter_queue: str | None = None
    dedup_window_ms: int = 300_000
    #: the next deadline of an item that failed or whose lease ran out (None: at once)
    retry: RetryPolicy | None = None
    group_limit: int | None = None
    leased_limit: int | None = None
    fair: bool = False
    rate_limit: RateLimit | None = None


@dataclass(frozen=True, slots=True)
class QueueStats:
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
    dead_lettered: int = 0
    lease_expired: int = 0
    oldest_lease_age_ms: int | None = None
    enqueue_per_s: float = 0.0
    dequeue_per_s: float = 0.0
    release_per_s: float = 0.0
    #: groups with a leased or a held item
    groups: int = 0
    #: due items the delivery rules hold back now
    held: int = 0
    #: deliveries the rate limit refused since the server started
    rate_limited: int = 0


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One of a queue's busiest groups (``Client.groups``): its leased items, the due
    items dequeue passed that it has not handed out, and how many of those it may not
    hand out now (its limit, its rate, an earlier item of it)."""

    group: str | None
    leased: int
    due: int
    held: int


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    config: QueueConfig
    stats: QueueStats


@dataclass(frozen=True, slots=True)
class MovedTo:
    """Where a dead-lettered or redriven item went: its queue and its new id there."""

    queue: str
    id: int


@dataclass(frozen=True, slots=True)
class Reason:
    """One failure of an item: the error, when (ms), which delivery failed."""

    error: str
    at: int
    delivery: int


@dataclass(frozen=True, slots=True)
class BrowsedItem:
    """An item seen without leasing it. ``state``: "due", "delayed", "leased" or "gone"
    (no longer in the queue; then ``deadline`` and ``stats`` are None)."""

    id: int
    deadline: int | None
    state: str
    stats: ItemStats | None
    value_size: int
    value: bytes | None = None
    lease_expires: int | None = None
    dead_lettered_from: str | None = None
    #: a gone item that was dead-lettered or redriven, while the server remembers the move
    moved_to: MovedTo | None = None
    #: the item's group (``docs/delivery.md``); None: it has none
    group: str | None = None
    #: why it failed, newest first (at most 5); empty if it never did
    errors: tuple[Reason, ...] = ()

    @property
    def last_error(self) -> str | None:
        return self.errors[0].error if self.errors else None

    @property
    def last_error_at(self) -> int | None:
        return self.errors[0].at if self.errors else None


@dataclass(frozen=True, slots=True)
class BrowsePage:
    """One page of a browse; pass ``next`` as ``after`` for the next one (None: the end)."""

    items: list[BrowsedItem]
    next: str | None


@dataclass(frozen=True, slots=True)
class RedriveResult:
    moved: int
    to: list[str]
    failed: list[Outcome]


@dataclass(frozen=True, slots=True)
class BackupResult:
    path: str
    bytes: int
    files: int
