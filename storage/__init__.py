"""The durable segmented deadline queue engine (``docs/storage.md``)."""

from __future__ import annotations

from storage.engine import Engine, EngineConfig
from storage.errors import StorageError
from storage.events import Event
from storage.types import (
    Delivery,
    Enqueued,
    Extend,
    ItemOutcome,
    ItemStats,
    NewItem,
    QueueConfig,
    QueueStats,
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
    "ItemOutcome",
    "ItemStats",
    "NewItem",
    "QueueConfig",
    "QueueStats",
    "Release",
    "Requeue",
    "StorageError",
]
