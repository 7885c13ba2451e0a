"""The JSON shapes of the HTTP API (docs/http.md), as pydantic models.

These models are the OpenAPI contract: request models validate input (a failure is
a 422 ``validation_error``), response models document what routes return. Values
travel as text with an ``encoding``: ``utf-8`` text as is, anything else base64.
Invariant: a request model that validated carries values and times the engine
accepts structurally (non-negative, 48-bit times, 64-bit ids); limits that depend on
settings (batch size, value size) are checked by the routes and the engine.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import fields
from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, ConfigDict, Field, model_validator, with_config
from pydantic_core import PydanticCustomError
from typing_extensions import TypedDict

from dq.storage.codec import MAX_DEADLINE, MAX_ID
from dq.storage.types import NewItem, Release
from dq.storage.validation import (
    BURST,
    GROUP_LIMIT,
    LEASE_MS,
    LEASED_LIMIT,
    NOT_BOTH,
    PER_SECOND,
    RECEIPT,
)

__all__ = [
    "QUEUE_NAME_REGEX",
    "BackupRequest",
    "BackupResponse",
    "BrowsePageOut",
    "BrowsedItemOut",
    "Deleted",
    "DequeueRequest",
    "DequeueResponse",
    "Encoding",
    "EnqueueRequest",
    "EnqueueResponse",
    "EnqueuedItem",
    "ErrorBody",
    "ExtendItem",
    "ExtendOne",
    "ExtendRequest",
    "FailItem",
    "FailOne",
    "FailRequest",
    "GroupOut",
    "GroupsOut",
    "Health",
    "InvalidItem",
    "ItemOut",
    "ItemResult",
    "ItemStatsOut",
    "KeyCancelled",
    "KeyMoved",
    "KeyPatch",
    "KeyedItemOut",
    "NewItemIn",
    "Purged",
    "QueueConfigBody",
    "QueueInfo",
    "QueueList",
    "QueueStatsOut",
    "RateLimitBody",
    "Rates",
    "ReasonOut",
    "RedriveFailure",
    "RedriveRequest",
    "RedriveResponse",
    "ReleaseItem",
    "ReleaseOne",
    "ReleaseRequest",
    "RequeueItem",
    "RequeueOne",
    "RequeueRequest",
    "Results",
    "RetryBody",
    "decode_value",
    "encode_value",
    "new_release",
    "to_new_items",
    "to_releases",
]

QUEUE_NAME_REGEX = r"^[A-Za-z0-9._-]{1,128}$"

Encoding = Literal["utf-8", "base64"]
Millis = Annotated[int, Field(ge=0, le=MAX_DEADLINE, description="ms since the epoch")]
Duration = Annotated[int, Field(ge=0, le=MAX_DEADLINE, description="milliseconds")]
#: A bound these fields break is worded by its rule (``storage/validation.py``;
#: ``server/errors.py`` finds the rule by the field's name), the same on every path.
Lease = Annotated[
    int, Field(ge=LEASE_MS.low, le=LEASE_MS.high, description="lease length in ms (at most 12 h)")
]
ItemId = Annotated[int, Field(ge=0, le=MAX_ID)]
Receipt = Annotated[str, Field(min_length=RECEIPT.low, max_length=RECEIPT.high)]
QueueName = Annotated[str, Field(pattern=QUEUE_NAME_REGEX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _When(_Strict):
    """``deadline`` and ``delay_ms`` are two ways to say when; at most one may be given."""

    deadline: Millis | None = Field(None, description="due time; default now")
    delay_ms: Duration | None = Field(None, description="due this many ms from now")

    @model_validator(mode="after")
    def _one_when(self) -> Any:
        if self.deadline is not None and self.delay_ms is not None:
            raise PydanticCustomError("not_both", NOT_BOTH)  # the rule's words alone
        return self


def decode_value(value: str, encoding: Encoding) -> bytes:
    if encoding == "utf-8":
        return value.encode("utf-8")  # a lone surrogate raises: not representable
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(
            f"value is not valid base64 ({exc}): send standard base64 with '=' padding, "
            "or text with encoding utf-8"
        ) from exc


def encode_value(value: bytes, encoding: Encoding | None) -> tuple[str, Encoding]:
    """Text for UTF-8 values unless base64 was asked for; base64 for anything else."""
    if encoding != "base64":
        try:
            return value.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
    return base64.b64encode(value).decode("ascii"), "base64"


@with_config(ConfigDict(extra="forbid"))
class NewItemIn(TypedDict):
    """One item to enqueue. ``deadline`` xor ``delay_ms`` and the value's encoding are
    checked by ``to_new_items``. A TypedDict, not a model: pydantic validates a batch of
    dicts ~3x faster than a batch of model instances, and batches are the hot path."""

    value: Annotated[str, Field(description="the item's value, as text in `encoding`")]
    encoding: NotRequired[Encoding]
    deadline: NotRequired[
        Annotated[Millis | None, Field(description="due time; default now (not with delay_ms)")]
    ]
    delay_ms: NotRequired[
        Annotated[Duration | None, Field(description="due this many ms from now")]
    ]
    key: NotRequired[
        Annotated[
            str | None,
            Field(
                description="idempotency key (1-128 bytes of UTF-8): within the queue's "
                "dedup_window_ms a repeat answers the first item and writes nothing"
            ),
        ]
    ]
    group: NotRequired[
        Annotated[
            str | None,
            Field(
                description="the item's group (1-128 printable ASCII characters), which "
                "the queue's delivery rules go by (docs/delivery.md)"
            ),
        ]
    ]
    on_duplicate: NotRequired[
        Annotated[
            Literal["keep", "replace"],
            Field(
                description="with a key seen within the window: keep (default) answers "
                "the key's item and writes nothing; replace gives the key's item, if it "
                "is pending, this value and deadline (one item, never two), else enqueues "
                "a new item the key names from then on (docs/retries.md)"
            ),
        ]
    ]


class InvalidItem(ValueError):
    """Item ``index`` of a batch is invalid (a 422 ``validation_error``)."""

    def __init__(self, index: int, message: str, field: str = "value") -> None:
        super().__init__(f"items.{index}: {message}")
        self.index = index
        self.field = field
        self.reason = message

    def details(self) -> list[dict[str, object]]:
        """The ``details`` of the 422, shaped as pydantic's are."""
        loc = ["body", "items", str(self.index), self.field]
        return [{"loc": loc, "msg": self.reason, "type": "value_error"}]


#: ``NewItem`` and ``Release`` are frozen dataclasses: their ``__init__`` sets each field
#: through ``object.__setattr__``, ~3x what writing their slots directly costs, once per
#: item of every enqueue and release. ``_new_item`` and ``new_release`` write the slots
#: (the same objects, compared equal and hashed alike); the assertions keep them in step
#: with the fields.
assert [f.name for f in fields(NewItem)] == [
    "value",
    "deadline",
    "delay_ms",
    "key",
    "group",
    "on_duplicate",
]
assert [f.name for f in fields(Release)] == ["id", "receipt"]
_make = object.__new__
_item_slots = NewItem.__dict__  # the slots' member descriptors
_set_value = _item_slots["value"].__set__
_set_deadline = _item_slots["deadline"].__set__
_set_delay = _item_slots["delay_ms"].__set__
_set_key = _item_slots["key"].__set__
_set_group = _item_slots["group"].__set__
_set_on_duplicate = _item_slots["on_duplicate"].__set__
_set_id = Release.__dict__["id"].__set__
_set_receipt = Release.__dict__["receipt"].__set__


def _new_item(
    value: bytes,
    deadline: int | None,
    delay_ms: int | None,
    key: str | None,
    group: str | None = None,
    on_duplicate: str = "keep",
) -> NewItem:
    item: NewItem = _make(NewItem)
    _set_value(item, value)
    _set_deadline(item, deadline)
    _set_delay(item, delay_ms)
    _set_key(item, key)
    _set_group(item, group)
    _set_on_duplicate(item, on_duplicate)
    return item


def new_release(item_id: int, receipt: str) -> Release:
    """``Release(item_id, receipt)``, made as ``_new_item`` makes a ``NewItem``."""
    release: Release = _make(Release)
    _set_id(release, item_id)
    _set_receipt(release, receipt)
    return release


def to_releases(items: list[ReleaseItem]) -> list[Release]:
    """The releases of a release or dequeue body."""
    new = new_release
    return [new(i["id"], i["receipt"]) for i in items]


def to_new_items(items: list[NewItemIn]) -> list[NewItem]:
    """Decode values and check ``deadline``/``delay_ms`` in one tight loop."""
    out: list[NewItem] = []
    append = out.append
    new_item = _new_item
    for n, i in enumerate(items):
        deadline, delay = i.get("deadline"), i.get("delay_ms")
        if deadline is not None and delay is not None:
            raise InvalidItem(n, NOT_BOTH, "delay_ms")
        encoding = i.get("encoding", "utf-8")
        try:
            value = i["value"]
            data = value.encode() if encoding == "utf-8" else decode_value(value, "base64")
        except UnicodeEncodeError:  # a lone surrogate: not representable as UTF-8
            raise InvalidItem(n, "value is not valid UTF-8 text; send it as base64") from None
        except ValueError as exc:  # bad base64: decode_value says how
            raise InvalidItem(n, str(exc)) from None
        append(
            new_item(
                data, deadline, delay, i.get("key"), i.get("group"), i.get("on_duplicate", "keep")
            )
        )
    return out


class EnqueueRequest(_Strict):
    items: list[NewItemIn] = Field(min_length=1)


class EnqueuedItem(BaseModel):
    id: int
    deadline: int
    duplicate: bool = Field(
        False,
        description="the key was seen within the window: the first item's id, nothing written",
    )
    replaced: bool = Field(
        False,
        description="on_duplicate replace: the key's pending item got this value and "
        "deadline (its id); present only when true",
    )


class EnqueueResponse(BaseModel):
    items: list[EnqueuedItem]


class ItemStatsOut(BaseModel):
    enqueue_time: int
    requeue_time: int
    dequeue_count: int


class ItemOut(BaseModel):
    id: int
    receipt: str
    value: str
    encoding: Encoding
    deadline: int
    stats: ItemStatsOut
    lease_expires: int
    group: str | None = Field(None, description="the item's group; null: none")
    last_error: str | None = Field(
        None,
        description="why the item's previous delivery failed (a fail's error, or 'lease "
        "expired'); present only when one did",
    )
    last_error_at: int | None = Field(None, description="when it failed (with last_error)")


class DequeueResponse(BaseModel):
    items: list[ItemOut]
    released: list[ItemResult] | None = Field(
        None, description="one result per release the request carried (only then)"
    )
    queue_exists: bool = Field(
        True,
        description="false (and only then present) when the queue does not exist: it was "
        "never created, or is misspelled; a worker may start before its producer",
    )


@with_config(ConfigDict(extra="forbid"))
class ReleaseItem(TypedDict):
    """A TypedDict for the same reason as ``NewItemIn``."""

    id: ItemId
    receipt: Receipt


class ReleaseRequest(_Strict):
    items: list[ReleaseItem] = Field(min_length=1)


class DequeueRequest(_Strict):
    count: int = Field(
        1,
        description="at most this many items (1 to the server's DQ_MAX_BATCH)",
        json_schema_extra={"minimum": 1},
    )
    lease_ms: Lease | None = Field(None, description="lease length; default: the queue's")
    wait_ms: Duration = Field(
        0, description="long-poll up to this long (clamped to the server's max)"
    )
    encoding: Encoding | None = Field(
        None, description="force base64 values; default text when UTF-8"
    )
    release: list[ReleaseItem] | None = Field(
        None,
        description="deliveries to release first (durably), answered per item in `released`",
    )


class RequeueItem(_When):
    id: ItemId
    receipt: Receipt


class RequeueRequest(_Strict):
    items: list[RequeueItem] = Field(min_length=1)


class FailItem(_Strict):
    id: ItemId
    receipt: Receipt
    error: str = Field(
        "",
        description="why it failed (up to 4096 bytes of UTF-8): kept with the item, shown on "
        "its next delivery, peek, browse and in the dead letters",
    )


class FailRequest(_Strict):
    items: list[FailItem] = Field(min_length=1)


class FailOne(_Strict):
    receipt: Receipt
    error: str = Field("", description="why it failed (up to 4096 bytes of UTF-8)")


class ExtendItem(_Strict):
    id: ItemId
    receipt: Receipt
    lease_ms: Lease


class ExtendRequest(_Strict):
    items: list[ExtendItem] = Field(min_length=1)


class ReleaseOne(_Strict):
    receipt: Receipt


class RequeueOne(_When):
    receipt: Receipt


class ExtendOne(_Strict):
    receipt: Receipt
    lease_ms: Lease


class ItemResult(BaseModel):
    """One item's outcome; ``error`` is a stable code when ``ok`` is false."""

    id: int
    ok: bool
    error: str | None = None
    message: str | None = None
    receipt: str | None = Field(None, description="extend: the new receipt")
    deadline: int | None = Field(None, description="requeue: the new deadline")
    lease_expires: int | None = Field(None, description="extend: when the lease now ends")


class Results(BaseModel):
    results: list[ItemResult]


class RetryBody(_Strict):
    """A retry policy: exponential (``initial_ms``, ``multiplier``, ``max_ms``,
    ``jitter``) or a list (``delays_ms``, the last repeating); its rules are checked by
    ``storage/retry.py`` (a 422 naming the field)."""

    initial_ms: int | None = Field(None, description="the first delay (exponential)")
    multiplier: float | None = Field(None, description="each delay this times the last (>= 1)")
    max_ms: int | None = Field(None, description="no delay longer than this")
    jitter: float | None = Field(
        None, description="0..1: each delay made up to this share shorter at random"
    )
    delays_ms: list[int] | None = Field(
        None, description="the delays in order (instead of the above); the last repeats"
    )


class RateLimitBody(_Strict):
    """A token bucket over deliveries (``docs/delivery.md``)."""

    per_second: float = Field(
        gt=PER_SECOND.low, le=PER_SECOND.high, description="tokens gained a second"
    )
    burst: int = Field(ge=BURST.low, le=BURST.high, description="tokens the bucket holds at most")
    per_group: bool = Field(
        False, description="a bucket for each group (items without one share one)"
    )


class QueueConfigBody(_Strict):
    default_lease_ms: Lease = 30_000
    max_deliveries: int | None = Field(None, ge=1, le=0xFFFFFFFF)
    dead_letter_queue: QueueName | None = Field(
        None, description="where items over max_deliveries go; default <queue>.dlq"
    )
    dedup_window_ms: int = Field(
        300_000,
        ge=0,
        le=7 * 24 * 3600 * 1000,
        description="how long idempotency keys are remembered (0: off)",
    )
    retry: RetryBody | None = Field(
        None,
        description="the next deadline of an item that failed or whose lease ran out; "
        "default: due again at once",
    )
    group_limit: int | None = Field(
        None,
        ge=GROUP_LIMIT.low,
        le=GROUP_LIMIT.high,
        description="at most this many items of one group leased at once (1: each group "
        "is FIFO); null: no limit",
    )
    leased_limit: int | None = Field(
        None,
        ge=LEASED_LIMIT.low,
        le=LEASED_LIMIT.high,
        description="at most this many items of the queue leased at once; null: no limit",
    )
    fair: bool = Field(False, description="serve the groups that have due items in turn")
    rate_limit: RateLimitBody | None = Field(
        None, description="a token bucket over deliveries; null: no limit"
    )


class Rates(BaseModel):
    enqueue_per_s: float
    dequeue_per_s: float
    release_per_s: float


class QueueStatsOut(BaseModel):
    pending: int
    due: int
    delayed: int
    leased: int
    segments: int
    bytes_on_disk: int
    oldest_due_age_ms: int | None
    next_id: int
    extra: dict[str, int] = Field(default_factory=dict)
    paused: bool = False
    paused_since: int | None = None
    dead_lettered: int = 0
    lease_expired: int = 0
    oldest_lease_age_ms: int | None = None
    rates: Rates | None = None
    groups: int = Field(0, description="groups with a leased or a held item")
    held: int = Field(0, description="due items the delivery rules hold back now")
    rate_limited: int = Field(
        0, description="deliveries the rate limit refused since the server started"
    )


class QueueInfo(BaseModel):
    name: str
    config: QueueConfigBody
    stats: QueueStatsOut


class QueueList(BaseModel):
    queues: list[QueueInfo]


class GroupOut(BaseModel):
    group: str | None = Field(description="the group; null: the items without one")
    leased: int
    due: int = Field(description="due items dequeue passed that the group has not handed out")
    held: int = Field(description="of those, the ones the group may not hand out now")


class GroupsOut(BaseModel):
    groups: list[GroupOut]


class Health(BaseModel):
    status: Literal["ok"]
    queues: int


class ErrorBody(BaseModel):
    error: str = Field(description="stable machine-readable code")
    message: str
    leader: str | None = Field(
        None, description="not_leader only: the leader's URL, where to send the request"
    )


class MovedToOut(BaseModel):
    """The queue a moved item went to and its new id there."""

    queue: str
    id: int


class ReasonOut(BaseModel):
    """One failure of an item."""

    error: str
    at: int = Field(description="when (ms since the epoch)")
    delivery: int = Field(description="which delivery failed (its dequeue_count)")


class BrowsedItemOut(BaseModel):
    """An item seen without leasing it; ``state`` "gone": no longer in the queue."""

    id: int
    deadline: int | None
    state: Literal["due", "delayed", "leased", "gone"]
    stats: ItemStatsOut | None
    value_size: int
    value: str | None = None
    encoding: Encoding | None = None
    lease_expires: int | None = None
    dead_lettered_from: str | None = None
    group: str | None = Field(None, description="the item's group; absent: none")
    moved_to: MovedToOut | None = Field(
        default=None,
        description="a gone item that was dead-lettered or redriven: where it went, while "
        "the server remembers the move",
    )
    last_error: str | None = Field(None, description="why it last failed (None: never)")
    last_error_at: int | None = Field(None, description="when it last failed")
    errors: list[ReasonOut] | None = Field(
        None, description="its reasons, newest first (at most 5; a redriven item's too)"
    )


class BrowsePageOut(BaseModel):
    items: list[BrowsedItemOut]
    next: str | None = Field(description="cursor of the next page (pass as after); null at the end")


class KeyedItemOut(BrowsedItemOut):
    """The item a key names (``GET /v1/queues/{queue}/keys/{key}``)."""

    key: str


class KeyPatch(_When):
    """A new deadline (``deadline`` or ``delay_ms``) and/or value for the pending item
    a key names."""

    value: str | None = Field(None, description="the new value, as text in `encoding`")
    encoding: Encoding = "utf-8"


class KeyMoved(BaseModel):
    id: int
    deadline: int = Field(description="the deadline the item has now")
    key: str


class KeyCancelled(BaseModel):
    cancelled: int = Field(description="the id of the item cancelled")
    key: str


class Purged(BaseModel):
    purged: int


class Deleted(BaseModel):
    deleted: int


class RedriveRequest(_Strict):
    to: QueueName | None = Field(None, description="default: the queue each item died in")
    ids: list[ItemId] | None = Field(None, description="default: every item")
    limit: int | None = Field(None, ge=1, description="move at most this many")


class RedriveFailure(BaseModel):
    id: int
    error: str
    message: str


class RedriveResponse(BaseModel):
    moved: int
    to: list[str]
    failed: list[RedriveFailure]


class BackupRequest(_Strict):
    dest: str = Field(
        min_length=1, description="a directory on the server's machine; must not exist"
    )


class BackupResponse(BaseModel):
    path: str
    bytes: int
    files: int
