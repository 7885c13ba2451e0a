"""Keyed enqueue batches that run once: the server half of Spark's idempotent writes.

A Spark write task that fails and is retried sends its rows again. Each task sends its
batch with a key (``<query>:<partition>:<epoch>``); ``IdempotentBatches`` remembers, for
a while, the result of every key that ran, so the retry gets the first answer back and
enqueues nothing. See ``docs/spark.md`` ("Writing").

Invariants: concurrent requests with one key run one at a time; a key whose batch was
refused (the engine raised) is not remembered and leaves nothing behind, so its retry
runs; the remembered results are bounded both in number (``max_keys``) and in bytes
(``max_bytes``, each result counted with its per-item and per-key overhead), oldest
forgotten first. Memory only: after a restart a retried batch is enqueued again.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from dq.storage.types import Enqueued, NewItem

__all__ = ["ITEM_COST", "KEY_COST", "IdempotentBatches"]

log = logging.getLogger(__name__)

#: Bytes one remembered ``Enqueued`` (id and deadline) costs, object and list slot included.
ITEM_COST = 80
#: Bytes one remembered key costs beside its items: the ordered-dict node, the tuple,
#: the digest and the key's own characters are added per key.
KEY_COST = 200


class Enqueuer(Protocol):
    """The part of ``storage.Engine`` this module uses."""

    def enqueue(self, name: str, items: Sequence[NewItem]) -> list[Enqueued]: ...


@dataclass(slots=True)
class _Done:
    at: float
    digest: bytes
    result: list[Enqueued]
    cost: int


@dataclass(slots=True)
class _Running:
    """The lock that serialises one key, and how many requests hold or wait on it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    users: int = 0


def _digest(items: Sequence[NewItem]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for it in items:
        h.update(b"%d:%r:%r:" % (len(it.value), it.deadline, it.delay_ms))
        h.update(it.value)
    return h.digest()


class IdempotentBatches:
    """Remembers the result of keyed enqueue batches for ``ttl_s``.

    A second request with a key seen before and the same items gets the first result
    back and enqueues nothing. A key seen before with *different* items (a retried task
    whose input changed) is enqueued again: a duplicate is better than a lost row.
    """

    def __init__(
        self,
        engine: Enqueuer,
        *,
        ttl_s: float = 3600.0,
        max_keys: int = 100_000,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._ttl_s = ttl_s
        self._max_keys = max_keys
        self._max_bytes = max_bytes
        self._clock = clock
        self._done: OrderedDict[tuple[str, str], _Done] = OrderedDict()
        self._bytes = 0
        self.mismatches = 0
        self._running: dict[tuple[str, str], _Running] = {}
        self._lock = threading.Lock()

    @property
    def remembered_bytes(self) -> int:
        """What the remembered results cost now, as counted against ``max_bytes``."""
        return self._bytes

    @property
    def running(self) -> int:
        """Keys with a request in progress or waiting (0 when the server is idle)."""
        with self._lock:
            return len(self._running)

    def enqueue(
        self, queue: str, key: str, items: Sequence[NewItem]
    ) -> tuple[list[Enqueued], bool]:
        """Enqueue ``items`` unless ``key`` ran before; returns (result, replayed)."""
        k = (queue, key)
        digest = _digest(items)
        with self._lock:
            self._expire()
            running = self._running.setdefault(k, _Running())
            running.users += 1
        try:
            with running.lock:
                with self._lock:
                    hit = self._done.get(k)
                if hit is not None:
                    if hit.digest == digest:
                        return hit.result, True
                    self.mismatches += 1
                    log.warning("batch key %r of queue %s came back with other items", key, queue)
                result = self._engine.enqueue(queue, items)
                with self._lock:
                    self._remember(k, _Done(self._clock(), digest, result, _cost(k, result)))
                return result, False
        finally:
            with self._lock:
                running.users -= 1
                if running.users == 0:
                    del self._running[k]

    def _remember(self, k: tuple[str, str], done: _Done) -> None:
        old = self._done.pop(k, None)
        if old is not None:
            self._bytes -= old.cost
        self._done[k] = done
        self._bytes += done.cost
        while self._done and (len(self._done) > self._max_keys or self._bytes > self._max_bytes):
            _, dropped = self._done.popitem(last=False)
            self._bytes -= dropped.cost

    def _expire(self) -> None:
        cutoff = self._clock() - self._ttl_s
        done = self._done
        while done:
            k, first = next(iter(done.items()))
            if first.at >= cutoff:
                break
            del done[k]
            self._bytes -= first.cost


def _cost(k: tuple[str, str], result: list[Enqueued]) -> int:
    return KEY_COST + len(k[0]) + len(k[1]) + ITEM_COST * len(result)
