"""The durable segmented deadline queue engine (``docs/storage.md``)."""

from __future__ import annotations

from dq.storage.engine import Engine, EngineConfig
from dq.storage.errors import StorageError
from dq.storage.events import Event
from dq.storage.retry import RetryPolicy
from dq.storage.types import (
    Delivery,
    Enqueued,
    Extend,
    Fail,
    ItemOutcome,
    ItemStats,
    NewItem,
    QueueConfig,
    QueueStats,
    RateLimit,
    Reason,
    Release,
    Requeue,
)

__all__ = [
    "Delivery",
    "Engine",
    "EngineConfig",
    "Enqueued",
    "Event",
    "Extend",
    "Fail",
    "ItemOutcome",
    "ItemStats",
    "NewItem",
    "QueueConfig",
    "QueueStats",
    "RateLimit",
    "Reason",
    "Release",
    "Requeue",
    "RetryPolicy",
    "StorageError",
]
