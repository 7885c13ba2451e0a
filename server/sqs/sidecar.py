"""Queue attributes dq's engine has no field for, kept durably beside the queue.

``<data dir>/queues/<queue>/sqs.json`` holds the SQS attributes that are not part of
the engine's queue config (``DelaySeconds``, ``ReceiveMessageWaitTimeSeconds``,
``MaximumMessageSize``, ``MessageRetentionPeriod``, ``Policy`` ...), the queue's tags,
its creation/modification times, and when a grouped message made it fair
(``dq.server.sqs.fair``). It is written atomically (temp file, fsync,
rename, fsync of the directory) and lives in the queue's own directory, so it goes
away with the queue and a recreated queue starts clean. The engine ignores files it
does not know. Reads are cached per queue object (a queue deleted and recreated is a
new object, so its cache entry is not reused).
"""

from __future__ import annotations

import json
import os
import threading
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dq.storage import fileio

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["SIDECAR", "Sidecar", "SidecarStore"]

SIDECAR = "sqs.json"


@dataclass(slots=True)
class Sidecar:
    attributes: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    #: epoch seconds; ``None`` for a queue created through the native API
    created: int | None = None
    modified: int | None = None
    #: epoch seconds when the SQS layer turned the queue's ``fair`` rule on, at its first
    #: message with a group; ``None`` until then (it does so once, so an operator's
    #: ``fair: false`` afterwards stands)
    fair_since: int | None = None

    def to_json(self) -> bytes:
        doc = {
            "version": 1,
            "attributes": self.attributes,
            "tags": self.tags,
            "created": self.created,
            "modified": self.modified,
            "fair_since": self.fair_since,
        }
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Sidecar:
        doc = json.loads(raw)
        return cls(
            {str(k): str(v) for k, v in doc.get("attributes", {}).items()},
            {str(k): str(v) for k, v in doc.get("tags", {}).items()},
            doc.get("created"),
            doc.get("modified"),
            doc.get("fair_since"),
        )

    def copy(self) -> Sidecar:
        return Sidecar(
            dict(self.attributes), dict(self.tags), self.created, self.modified, self.fair_since
        )


class SidecarStore:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[weakref.ref[object], Sidecar]] = {}

    def load(self, engine: Engine, name: str) -> Sidecar:
        """The queue's sidecar (empty if it has none); ``QueueNotFound`` if no queue."""
        q = engine.queue(name)
        with self._lock:
            hit = self._cache.get(name)
            if hit is not None and hit[0]() is q:
                return hit[1].copy()
        try:
            with open(os.path.join(q.directory, SIDECAR), "rb") as f:
                sidecar = Sidecar.from_json(f.read())
        except FileNotFoundError:
            sidecar = Sidecar()
        with self._lock:
            self._cache[name] = (weakref.ref(q), sidecar)
        return sidecar.copy()

    def save(self, engine: Engine, name: str, sidecar: Sidecar) -> None:
        """Write durably (blocking: call from a worker thread)."""
        q = engine.queue(name)
        fileio.write_file_atomic(os.path.join(q.directory, SIDECAR), sidecar.to_json())
        with self._lock:
            self._cache[name] = (weakref.ref(q), sidecar.copy())

    def forget(self, name: str) -> None:
        with self._lock:
            self._cache.pop(name, None)
