"""``ReceiveRequestAttemptId``: a FIFO receive retried after a lost answer gets the
same messages.

A consumer whose receive failed on the way back (a timeout, a dropped connection) does
not know what it was given, while the messages are leased to it and, on a FIFO queue,
hold their groups until their visibility timeout runs out. Retried with the same
attempt id within 5 minutes, the receive answers the same messages and receipt handles
again and restarts their visibility timeout, as SQS does, so nothing waits out a lease
nobody holds. The SQS layer remembers each such receive here, in memory: leases do not
outlive a restart either.

- A retry finds its receive only while every message it remembers is unchanged by the
  consumer: once one of them was deleted or had its visibility changed, the attempt id
  is spent and a retry is refused (``ChangedSince``), as SQS refuses it.
- A message whose visibility timeout ran out meanwhile (or that went to the
  dead-letter queue, or was purged) is not answered again: it is visible to everyone.
  If none is left, the retry receives anew under the same attempt id.
- Receives with the same attempt id run one at a time, so a retry that arrives while
  the first try still long-polls waits for its answer instead of taking more messages.

Bounds: at most ``limit`` receives are remembered (the oldest go first), each for
``window_ms``; a forgotten one is received anew.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from dq.storage.types import Delivery

__all__ = ["Attempt", "ChangedSince", "ReceiveAttempts"]

#: How long SQS honours a ``ReceiveRequestAttemptId``.
WINDOW_MS = 300_000


class ChangedSince(Exception):
    """A message the attempt received was deleted or had its visibility changed."""


@dataclass(slots=True)
class Attempt:
    #: when the receive was made (ms): the attempt id is good for ``window_ms`` from it
    at: int
    #: the receive's visibility timeout as a lease (None: the queue's default)
    lease_ms: int | None
    deliveries: list[Delivery]
    changed: bool = False


class ReceiveAttempts:
    def __init__(self, limit: int = 10_000, window_ms: int = WINDOW_MS) -> None:
        self._limit = limit
        self._window_ms = window_ms
        self._lock = threading.Lock()
        self._attempts: OrderedDict[tuple[str, str], Attempt] = OrderedDict()
        #: (queue, receipt) → the attempt that received it
        self._by_receipt: dict[tuple[str, str], tuple[str, str]] = {}
        self._running: dict[tuple[str, str], tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def serial(self, queue: str, attempt_id: str) -> AsyncIterator[None]:
        """Run the receives of one attempt id one at a time (on the server's loop)."""
        key = (queue, attempt_id)
        lock, users = self._running.get(key, (asyncio.Lock(), 0))
        self._running[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._running[key]
            if users == 1:
                del self._running[key]
            else:
                self._running[key] = (lock, users - 1)

    def find(self, queue: str, attempt_id: str, now: int) -> Attempt | None:
        """The receive made with this attempt id within the window, if remembered;
        ``ChangedSince`` if the consumer changed one of its messages since."""
        with self._lock:
            self._prune(now)
            attempt = self._attempts.get((queue, attempt_id))
        if attempt is not None and attempt.changed:
            raise ChangedSince(attempt_id)
        return attempt

    def remember(
        self,
        queue: str,
        attempt_id: str,
        now: int,
        lease_ms: int | None,
        deliveries: list[Delivery],
    ) -> None:
        key = (queue, attempt_id)
        with self._lock:
            self._drop(key)
            self._attempts[key] = Attempt(now, lease_ms, deliveries)
            for d in deliveries:
                self._by_receipt[(queue, d.receipt)] = key
            while len(self._attempts) > self._limit:
                self._drop(next(iter(self._attempts)))

    def keep(self, queue: str, attempt_id: str, deliveries: list[Delivery]) -> None:
        """A retry answered only ``deliveries`` (the others are visible again)."""
        key = (queue, attempt_id)
        with self._lock:
            attempt = self._attempts.get(key)
            if attempt is None:
                return
            kept = {d.receipt for d in deliveries}
            for d in attempt.deliveries:
                if d.receipt not in kept and self._by_receipt.get((queue, d.receipt)) == key:
                    del self._by_receipt[(queue, d.receipt)]
            attempt.deliveries = deliveries

    def changed(self, queue: str, receipts: Iterable[str]) -> None:
        """The consumer deleted these deliveries or changed their visibility."""
        with self._lock:
            for r in receipts:
                key = self._by_receipt.pop((queue, r), None)
                attempt = None if key is None else self._attempts.get(key)
                if attempt is not None:
                    attempt.changed = True

    def forget_queue(self, queue: str) -> None:
        with self._lock:
            for key in [k for k in self._attempts if k[0] == queue]:
                self._drop(key)

    def __len__(self) -> int:
        return len(self._attempts)

    def _prune(self, now: int) -> None:
        attempts = self._attempts
        while attempts:
            key, first = next(iter(attempts.items()))
            if first.at + self._window_ms > now:
                break
            self._drop(key)

    def _drop(self, key: tuple[str, str]) -> None:
        attempt = self._attempts.pop(key, None)
        if attempt is None:
            return
        for d in attempt.deliveries:
            if self._by_receipt.get((key[0], d.receipt)) == key:
                del self._by_receipt[(key[0], d.receipt)]
