"""Engine events, delivered to ``Engine.on_event`` listeners (the broadcast ring uses them)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EVENT_KINDS", "Event"]

EVENT_KINDS = (
    "enqueued",
    "requeued",
    "released",
    "lease_expired",
    "dead_lettered",
    "queue_created",
    "queue_deleted",
)


@dataclass(frozen=True, slots=True)
class Event:
    kind: str
    queue: str
    ids: tuple[int, ...]
    time: int
