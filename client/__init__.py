"""Deadline Queue client: ``Client``/``AsyncClient`` over HTTP (or shared memory).

from dq.client import Client
with Client("http://127.0.0.1:8080") as dq:
    dq.enqueue("emails", b"hello", delay_ms=5_000)
    for item in dq.dequeue("emails", count=10, wait_ms=20_000):
        dq.release("emails", item.id, item.receipt)
"""

from __future__ import annotations

from dq.client._async_client import AsyncClient
from dq.client._client import Client
from dq.client._schedules import Schedule, ScheduleRun
from dq.client._transport import AsyncTransport, Transport
from dq.client.errors import (
    BadRequest,
    ClientError,
    Conflict,
    ItemLeased,
    ItemNotFound,
    KeyNotFound,
    NotFound,
    NotLeaderError,
    QueueNotFound,
    ServerError,
    StaleReceipt,
    StorageFull,
    TooLarge,
    TransportError,
    Unauthorized,
    Unavailable,
    UnsupportedAddress,
    ValidationError,
)
from dq.client.jobs import AsyncConsumer, Backoff, Consumer, ConsumerStats
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    Fail,
    GroupInfo,
    Item,
    ItemStats,
    MovedTo,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    QueueStats,
    RateLimit,
    Reason,
    RedriveResult,
    Release,
    Requeue,
    RetryPolicy,
)

__all__ = [
    "AsyncClient",
    "AsyncConsumer",
    "AsyncTransport",
    "Backoff",
    "BackupResult",
    "BadRequest",
    "BrowsePage",
    "BrowsedItem",
    "Client",
    "ClientError",
    "Conflict",
    "Consumer",
    "ConsumerStats",
    "Dequeued",
    "Enqueued",
    "Extend",
    "Fail",
    "GroupInfo",
    "Item",
    "ItemLeased",
    "ItemNotFound",
    "ItemStats",
    "KeyNotFound",
    "MovedTo",
    "NewItem",
    "NotFound",
    "NotLeaderError",
    "Outcome",
    "QueueConfig",
    "QueueInfo",
    "QueueNotFound",
    "QueueStats",
    "RateLimit",
    "Reason",
    "RedriveResult",
    "Release",
    "Requeue",
    "RetryPolicy",
    "Schedule",
    "ScheduleRun",
    "ServerError",
    "StaleReceipt",
    "StorageFull",
    "TooLarge",
    "Transport",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedAddress",
    "ValidationError",
]
