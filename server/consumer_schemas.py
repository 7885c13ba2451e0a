"""The JSON shapes of the consumer-group and keyed-batch routes, as pydantic models.

Request models validate input (a failure is a 422 ``validation_error``); response
models are the OpenAPI contract of ``server/routers/consumers.py``, whose handlers
answer pre-built JSON (the read route is the hot path of every Spark task), so these
models document the answers without being run on them. The protocol: ``docs/spark.md``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from dq.storage.validation import NOT_BOTH

__all__ = [
    "BatchItem",
    "CommitBody",
    "CommitOut",
    "ConsumerList",
    "ConsumerOut",
    "KeyedBatch",
    "KeyedBatchOut",
    "KeyedItemOut",
    "OpenBody",
    "OpenOut",
    "PullBody",
    "PullOut",
    "ReadBody",
    "ReadColumnsOut",
    "ReadItemOut",
    "ReadItemStatsOut",
    "ReadOut",
    "RequeueBody",
    "SeqsBody",
]

_LEASE = Field(default=None, ge=1, le=12 * 3600_000)
_TIME = Field(default=None, ge=0, lt=1 << 48)


class OpenBody(BaseModel):
    lease_ms: int | None = _LEASE
    idle_timeout_ms: int | None = Field(default=None, ge=1000, le=7 * 24 * 3600_000)


class PullBody(BaseModel):
    after: int = Field(ge=0)
    max_items: int = Field(ge=0, le=1_000_000)
    max_new: int | None = Field(default=None, ge=0)
    lease_ms: int | None = _LEASE


class ReadBody(BaseModel):
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    encoding: Literal["base64", "auto"] = "base64"
    #: ``items``: a list of item objects; ``columns``: one array per field and every
    #: value in one base64 string (``values``) cut by ``lengths``: far cheaper to build
    #: and to turn into Arrow, which is what Spark executors do.
    layout: Literal["items", "columns"] = "items"


class CommitBody(BaseModel):
    upto: int = Field(ge=0)


class SeqsBody(BaseModel):
    seqs: list[int] = Field(max_length=1_000_000)


class RequeueBody(BaseModel):
    seqs: list[int] | None = None
    deadline: int | None = _TIME
    delay_ms: int | None = _TIME

    @model_validator(mode="after")
    def _one_time(self) -> RequeueBody:
        if self.deadline is not None and self.delay_ms is not None:
            raise PydanticCustomError("not_both", NOT_BOTH)  # the rule's words alone
        return self


class BatchItem(BaseModel):
    value: str
    encoding: Literal["utf-8", "base64"] = "utf-8"
    deadline: int | None = _TIME
    delay_ms: int | None = _TIME


class KeyedBatch(BaseModel):
    key: str = Field(min_length=1, max_length=512)
    items: list[BatchItem] = Field(min_length=1)


class ConsumerOut(BaseModel):
    """A consumer's log: ``bytes`` is what it holds, counted as ``max_log_bytes`` counts."""

    queue: str
    consumer: str
    epoch: str
    next_seq: int
    first_unacked: int
    in_flight: int
    bytes: int
    lease_ms: int
    idle_timeout_ms: int
    lost: int


class OpenOut(ConsumerOut):
    """The consumer, and how many items of its queue are due now."""

    queue_due: int


class ConsumerList(BaseModel):
    consumers: list[ConsumerOut]


class PullOut(BaseModel):
    """The log range ``[start, end)`` to read; ``pulled`` items were leased by this call."""

    epoch: str
    start: int
    end: int
    pulled: int
    in_flight: int
    queue_exists: bool = Field(
        True,
        description="false (and only then present) when the queue does not exist: it was "
        "never created, or is misspelled",
    )


class ReadItemStatsOut(BaseModel):
    enqueue_time: int
    requeue_time: int
    dequeue_count: int


class ReadItemOut(BaseModel):
    seq: int
    id: int
    receipt: str
    value: str
    encoding: Literal["utf-8", "base64"]
    deadline: int
    stats: ReadItemStatsOut
    lease_expires: int


class ReadColumnsOut(BaseModel):
    """One array per field; ``values`` is every value in one base64 string cut by ``lengths``."""

    seq: list[int]
    id: list[int]
    receipt: list[str]
    deadline: list[int]
    enqueue_time: list[int]
    requeue_time: list[int]
    dequeue_count: list[int]
    lease_expires: list[int]
    lengths: list[int]
    values: str


class ReadOut(BaseModel):
    """``found`` is false when the server does not know the consumer (it restarted)."""

    found: bool
    epoch: str | None
    items: list[ReadItemOut] | None = None
    columns: ReadColumnsOut | None = None


class CommitOut(BaseModel):
    released: int
    stale: int
    first_unacked: int
    next_seq: int


class KeyedItemOut(BaseModel):
    id: int
    deadline: int


class KeyedBatchOut(BaseModel):
    """``replayed``: the key ran before; these are its first results, nothing was enqueued."""

    replayed: bool
    items: list[KeyedItemOut]
