"""The workload: producers enqueue unique values, consumers dequeue and release them,
and every outcome goes into the history.

Each worker has its own ``Client`` given every node's URL: it follows a 421 to the
leader, tries the other nodes when one does not answer, and leaves a node whose answer
timed out (a stalled leader) for the others. An enqueue is ``ok`` only
when answered with ids; ``fail`` only when the server refused it in a way that says
nothing was written; anything else (no answer, a replication timeout) is ``unknown``.
Values carry a random delay (some are due at once, some later) so that early
deliveries would show; consumers leave some items unreleased so leases run out and
items come back. Half the producers send keyed items and repeat unknown outcomes with
the same keys; half the consumers carry their releases on their next dequeue.
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

from dq.client import Client
from dq.client.errors import ClientError, ServerError
from dq.client.types import NewItem, QueueConfig, Release
from tests.jepsen.history import History, now_ceil, now_floor

__all__ = ["QUEUE", "TIMEOUT_S", "Workload", "outcome_of"]

log = logging.getLogger(__name__)

QUEUE = "jepsen"
LEASE_MS = 2000
#: every worker's client timeout per request
TIMEOUT_S = 5.0
_DELAYS_MS = (0, 0, 0, 300, 1500)
#: statuses that say the request changed nothing (validation; not the leader; a leader
#: whose sync set has acknowledged nothing for a while refusing before it writes)
_REFUSED = {400, 404, 413, 421, 422}
_REFUSED_503 = {"no_leader", "not_leader", "replication_stalled"}


def outcome_of(exc: BaseException) -> str:
    if isinstance(exc, ServerError) and (
        exc.status in _REFUSED or (exc.status == 503 and exc.code in _REFUSED_503)
    ):
        return "fail"
    return "unknown"


def payload(value: str, size: int) -> bytes:
    """The bytes sent for ``value``: the value, then (``size`` > 0) filler derived from it,
    so a delivery can be checked byte for byte while the history keeps only the value."""
    head = value.encode()
    if size <= len(head):
        return head
    seed = hashlib.sha256(head).digest()
    fill = (seed * (size // len(seed) + 1))[: size - len(head) - 1]
    return head + b"|" + fill


def value_of(data: bytes, size: int) -> str:
    """The value a delivered payload carries; ``corrupt:...`` when its bytes are not the
    ones sent (the checker then finds a value nobody enqueued)."""
    head = data.split(b"|", 1)[0].decode(errors="replace")
    return head if payload(head, size) == data else f"corrupt:{head}"


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


class Workload:
    def __init__(
        self,
        urls: Sequence[str],
        history: History,
        *,
        producers: int = 2,
        keys: bool = True,
        value_bytes: int = 0,
        consumers: int = 2,
        timeout_s: float = TIMEOUT_S,
        pause_s: float = 0.01,
    ) -> None:
        self.urls = list(urls)
        self.value_bytes = value_bytes
        self.history = history
        self.timeout_s = timeout_s
        self.pause_s = pause_s
        self.producing = threading.Event()
        self.consuming = threading.Event()
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.delivered: set[str] = set()
        self.last_delivery = 0.0
        self.counts: dict[str, int] = {}
        # Every other producer sends keyed items, every other consumer releases by
        # riding its releases on the next dequeue.
        self.threads = [
            threading.Thread(
                target=self._produce, args=(f"p{i}", keys and i % 2 == 1), name=f"p{i}", daemon=True
            )
            for i in range(producers)
        ] + [
            threading.Thread(
                target=self._consume, args=(f"c{i}", i % 2 == 1), name=f"c{i}", daemon=True
            )
            for i in range(consumers)
        ]

    def client(self) -> Client:
        return Client(",".join(self.urls), timeout=self.timeout_s)

    def create_queue(self) -> None:
        with self.client() as c:
            c.put_queue(QUEUE, QueueConfig(default_lease_ms=LEASE_MS))

    def start(self) -> None:
        self.producing.set()
        self.consuming.set()
        for t in self.threads:
            t.start()

    def stop_producers(self) -> None:
        self.producing.clear()

    def stop(self, timeout: float = 30.0) -> None:
        self.producing.clear()
        self.consuming.clear()
        for t in self.threads:
            t.join(timeout)
            if t.is_alive():
                log.error("worker %s did not stop within %.0fs", t.name, timeout)

    def missing(self) -> set[str]:
        """Acknowledged values not delivered yet."""
        with self.lock:
            return self.acked - self.delivered

    def _count(self, key: str, n: int = 1) -> None:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + n

    # producers ----------------------------------------------------------------------
    def _produce(self, name: str, keyed: bool) -> None:
        """Batches of 1-4 unique values. ``keyed``: each value is also its item's key,
        and a batch whose outcome is unknown is sent again (up to twice) with the same
        keys: the repeat must be answered with the first items' ids."""
        rng = random.Random()
        seq = 0
        with self.client() as client:
            while self.producing.is_set():
                values = []
                for _ in range(rng.choice((1, 1, 2, 4))):
                    seq += 1
                    values.append(f"{name}-{seq}")
                delay = rng.choice(_DELAYS_MS)
                for _attempt in range(3 if keyed else 1):
                    if self._enqueue(client, values, delay, keyed) != "unknown":
                        break
                    time.sleep(0.2)
                time.sleep(self.pause_s)

    def _enqueue(self, client: Client, values: list[str], delay_ms: int, keyed: bool) -> str:
        items = [NewItem(payload(v, self.value_bytes), delay_ms=delay_ms or None, key=v if keyed else None) for v in values]  # fmt: skip
        invoke = now_floor()
        base: dict[str, Any] = {"type": "enqueue", "invoke": invoke, "delay_ms": delay_ms}
        if keyed:
            base["keyed"] = True
        try:
            done = client.enqueue_many(QUEUE, items)
        except ClientError as exc:
            outcome = outcome_of(exc)
            complete = now_ceil()
            for v in values:
                self.history.add({**base, "value": v, "complete": complete, "outcome": outcome, "error": _error(exc)})  # fmt: skip
            self._count(f"enqueue_{outcome}", len(values))
            return outcome
        complete = now_ceil()
        for v, e in zip(values, done, strict=True):
            self.history.add({**base, "value": v, "complete": complete, "outcome": "ok", "id": e.id, "deadline": e.deadline, "duplicate": e.duplicate})  # fmt: skip
        with self.lock:
            self.acked.update(values)
        self._count("enqueue_ok", len(values))
        self._count("enqueue_duplicate", sum(e.duplicate for e in done))
        return "ok"

    # consumers ----------------------------------------------------------------------
    def _consume(self, name: str, ride: bool) -> None:
        """Dequeue up to 5, release about 90 % of them (the rest wait for their lease to
        run out and must come back): with ``release_many``, or (``ride``) carried by
        the next dequeue."""
        rng = random.Random()
        carried: list[Any] = []
        with self.client() as client:
            while self.consuming.is_set():
                invoke = now_floor()
                batch = [Release(it.id, it.receipt) for it in carried]
                try:
                    items = client.dequeue(QUEUE, count=5, lease_ms=LEASE_MS, wait_ms=300, release=batch)  # fmt: skip
                except ClientError as exc:
                    self._record_releases(carried, invoke, now_ceil(), None, exc)
                    carried = []
                    self._count(f"dequeue_{type(exc).__name__}")
                    time.sleep(0.05)
                    continue
                complete = now_ceil()
                self._record_releases(carried, invoke, complete, items.released, None)
                carried = []
                for it in items:
                    value = value_of(it.value, self.value_bytes)
                    self.history.add({
                        "type": "deliver", "value": value, "id": it.id, "deadline": it.deadline,
                        "receipt": it.receipt, "lease_expires": it.lease_expires,
                        "invoke": invoke, "complete": complete, "worker": name,
                    })  # fmt: skip
                    with self.lock:
                        self.delivered.add(value)
                        self.last_delivery = complete / 1000
                keep = [it for it in items if rng.random() < 0.9]
                if ride:
                    carried = keep
                elif keep:
                    self._release(client, keep)

    def _release(self, client: Client, items: list[Any]) -> None:
        invoke = now_floor()
        try:
            outcomes = client.release_many(QUEUE, [Release(it.id, it.receipt) for it in items])
        except ClientError as exc:
            self._record_releases(items, invoke, now_ceil(), None, exc)
            return
        self._record_releases(items, invoke, now_ceil(), outcomes, None)

    def _record_releases(
        self,
        items: list[Any],
        invoke: int,
        complete: int,
        outcomes: list[Any] | None,
        exc: ClientError | None,
    ) -> None:
        for i, it in enumerate(items):
            event: dict[str, Any] = {
                "type": "release", "id": it.id, "value": value_of(it.value, self.value_bytes), "receipt": it.receipt,
                "invoke": invoke, "complete": complete,
            }  # fmt: skip
            if exc is not None:
                event.update(outcome=outcome_of(exc), error=_error(exc))
            else:
                assert outcomes is not None
                o = outcomes[i]
                event.update(outcome="ok" if o.ok else "fail", error=o.error)
            self.history.add(event)
            self._count(f"release_{event['outcome']}")
