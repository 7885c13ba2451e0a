"""The client side of the three rings: discovery, submitting, subscribing, telemetry.

Owns reading ``dq-rings.json`` (docs/shm.md, "Discovery of the other three rings") and
mapping the rings it names. ``subscribe(data_dir, queue)`` yields the server's events
(``dq.storage.events.Event``) for one queue or all; ``submitter(data_dir)`` returns a
``Submitter``; ``telemetry(data_dir)`` a ``TelemetryRing`` for ``dq.shm.telemetry.latest``.
Invariant kept: a subscription reads every event from the moment it joined, in order,
or raises ``SubscriberEvicted``; it gives its reader entry back on ``close``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dq.shm.attach import open_shm
from dq.shm.broadcast_ring import BroadcastReader
from dq.shm.errors import AttachError
from dq.shm.events import decode
from dq.shm.submitter import Submitter
from dq.shm.telemetry_ring import TelemetryRing
from dq.storage.events import Event

__all__ = ["Subscription", "discover", "open_ring", "submitter", "subscribe", "telemetry"]

DISCOVERY = "dq-rings.json"


def discover(data_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(data_dir) / DISCOVERY
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise AttachError(_why_no_rings(Path(data_dir))) from exc
    except (OSError, ValueError) as exc:
        raise AttachError("unreadable ring discovery file", path=str(path)) from exc
    if doc.get("version") != 1:
        raise AttachError("unsupported ring discovery version", version=doc.get("version"))
    return doc


def _why_no_rings(data_dir: Path) -> str:
    """Why ``data_dir`` has no discovery file, from what is on disk alone (nothing is
    locked or attached to find out). A directory no server ever used (no ``LOCK``) is
    most often the wrong one: ``./dq-data`` outside the directory the server runs in."""
    if not data_dir.is_dir():
        return (
            f"no data directory {data_dir}: give the one the server was started with "
            "(--data-dir, DQ_DATA_DIR)"
        )
    if not (data_dir / "LOCK").exists():
        return (
            f"{data_dir} is not a dq data directory (no server has used it): give the one "
            "the server was started with (--data-dir, DQ_DATA_DIR)"
        )
    return (
        f"no rings served for {data_dir}: no server runs on it, or it was started with "
        "--no-shm (DQ_SHM=0)"
    )


def open_ring(data_dir: str | os.PathLike[str], ring: str) -> Any:
    entry = discover(data_dir).get(ring)
    if not isinstance(entry, dict):
        raise AttachError("ring missing from the discovery file", ring=ring)
    return open_shm(str(entry["shm"]), int(entry["size"]))


def submitter(data_dir: str | os.PathLike[str]) -> Submitter:
    return Submitter(open_ring(data_dir, "submission"))


def telemetry(data_dir: str | os.PathLike[str]) -> TelemetryRing:
    return TelemetryRing(open_ring(data_dir, "telemetry"))


class Subscription:
    """Events from the broadcast ring, optionally for one queue."""

    def __init__(self, buf: Any, queue: str | None = None) -> None:
        self.queue = queue
        self.reader = BroadcastReader(buf)

    def poll(self, timeout_s: float = 0.0) -> list[Event]:
        """The next events (maybe none after ``timeout_s``), in publication order."""
        give_up = time.monotonic() + timeout_s
        while True:
            left = max(0.0, give_up - time.monotonic())
            events = [decode(m) for m in self.reader.poll(left)]
            if self.queue is not None:
                events = [e for e in events if e.queue == self.queue]
            if events or time.monotonic() >= give_up:
                return events

    def __iter__(self) -> Iterator[Event]:
        while True:
            yield from self.poll(1.0)

    def close(self) -> None:
        self.reader.close()
        with contextlib.suppress(BufferError, ValueError, AttributeError):
            self.reader.buf.close()  # our own mapping of the ring

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(data_dir: str | os.PathLike[str], queue: str | None = None) -> Subscription:
    """Subscribe to the server's events for ``queue`` (all queues if None)."""
    return Subscription(open_ring(data_dir, "broadcast"), queue)
