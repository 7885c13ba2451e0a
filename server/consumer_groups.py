"""Named consumers with a delivery log: the server half of the at-least-once protocol.

A Spark query cannot hold leases the way one Python consumer does: its driver plans a
micro-batch, executors read it (and re-read it when a task is retried), and Spark
acknowledges the batch only while it plans the next one, or when the next run of the
same checkpoint starts. So the server keeps, per ``(queue, consumer)``, a **delivery
log**: every item the consumer's driver pulls gets the next sequence number; executors
read ranges of the log by sequence; the driver commits "everything below ``upto``".
See ``docs/spark.md`` for the protocol and its failure cases.

Invariants this module keeps:

- sequence numbers of one consumer never go backwards, not even after a server restart
  (a re-created log starts at the position the client gives, never below it);
- an entry stays in the log, readable with its value and with its lease kept alive by
  ``keep_alive``, until it is acknowledged (commit, ack, requeue), its lease is lost
  (the engine says the receipt is stale), or the consumer goes idle past its timeout,
  when every entry is given back to the queue;
- values of un-acknowledged entries are held in memory, bounded by ``max_log_bytes``
  over all consumers: ``pull`` leases no more once the bound is reached.

The log lives in memory only. Dequeue writes nothing durable, so after a restart every
un-acknowledged item is pending again and is delivered again: at-least-once.

``IdempotentBatches`` remembers, for a while, which keyed enqueue batches already ran,
so a retried Spark write task does not enqueue its rows twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dq.storage.errors import QueueNotFound
from dq.storage.types import (
    Delivery,
    Enqueued,
    Extend,
    ItemOutcome,
    NewItem,
    QueueStats,
    Release,
    Requeue,
)

__all__ = [
    "CommitResult",
    "ConsumerGroups",
    "ConsumerState",
    "IdempotentBatches",
    "LogEntry",
    "PullResult",
]

log = logging.getLogger(__name__)

#: ``keep_alive`` runs every second; a lease this close to its end is always extended.
KEEPALIVE_MARGIN_MS = 2_500
#: Leases of consumer pulls are never shorter, so at least two keep-alive ticks fall
#: inside the margin even on a busy server. (A short lease buys nothing here: the
#: server itself gives a consumer's items back when it is deleted or idle.)
MIN_LEASE_MS = 5_000


class EngineLike(Protocol):
    """The part of ``storage.Engine`` this module uses."""

    def now(self) -> int: ...
    def enqueue(self, name: str, items: Sequence[NewItem]) -> list[Enqueued]: ...
    def dequeue(self, name: str, count: int = 1, lease_ms: int | None = None) -> list[Delivery]: ...
    def release(self, name: str, items: Sequence[Release]) -> list[ItemOutcome]: ...
    def requeue(self, name: str, items: Sequence[Requeue]) -> list[ItemOutcome]: ...
    def extend(self, name: str, items: Sequence[Extend]) -> list[ItemOutcome]: ...
    def stats(self, name: str) -> QueueStats: ...


@dataclass(slots=True)
class LogEntry:
    """One delivery held in a consumer's log; ``receipt`` changes when the lease is extended."""

    seq: int
    delivery: Delivery
    receipt: str
    lease_expires: int


@dataclass(slots=True)
class _Log:
    queue: str
    consumer: str
    lease_ms: int
    idle_timeout_ms: int
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    next_seq: int = 0
    first: int = 0  # no un-acknowledged entry below this sequence
    entries: dict[int, LogEntry] = field(default_factory=dict)
    bytes: int = 0
    last_active: float = field(default_factory=time.monotonic)
    lost: int = 0  # entries dropped because their lease was lost
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_unacked(self) -> int:
        entries, first, end = self.entries, self.first, self.next_seq
        while first < end and first not in entries:
            first += 1
        self.first = first
        return first

    def drop(self, seq: int) -> LogEntry | None:
        entry = self.entries.pop(seq, None)
        if entry is not None:
            self.bytes -= len(entry.delivery.value)
        return entry


@dataclass(frozen=True, slots=True)
class ConsumerState:
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


@dataclass(frozen=True, slots=True)
class PullResult:
    """The log range ``[start, end)`` the caller should read; ``pulled`` items are new."""

    epoch: str
    start: int
    end: int
    pulled: int
    in_flight: int


@dataclass(frozen=True, slots=True)
class CommitResult:
    released: int
    stale: int
    first_unacked: int
    next_seq: int


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


class ConsumerGroups:
    """Every consumer log of one server process. Thread-safe; engine calls block."""

    def __init__(
        self,
        engine: EngineLike,
        *,
        max_log_bytes: int = 256 << 20,
        max_batch: int = 1000,
        default_lease_ms: int = 30_000,
        default_idle_timeout_ms: int = 15 * 60_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._max_log_bytes = max_log_bytes
        self._max_batch = max_batch
        self._default_lease_ms = default_lease_ms
        self._default_idle_timeout_ms = default_idle_timeout_ms
        self._clock = clock
        self._logs: dict[tuple[str, str], _Log] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, interval_s: float = 1.0) -> None:
        """Run ``keep_alive`` every ``interval_s`` seconds in a daemon thread."""
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, args=(interval_s,), name="dq-consumer-keepalive", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the keep-alive thread. Logs are dropped; their items come back by expiry."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            try:
                self.keep_alive()
            except Exception:  # the thread must survive a transient engine error
                log.exception("consumer keep-alive failed")

    # -- lookup ------------------------------------------------------------------------

    def _get(self, queue: str, consumer: str) -> _Log | None:
        with self._lock:
            found = self._logs.get((queue, consumer))
        if found is not None:
            found.last_active = self._clock()
        return found

    def _get_or_create(
        self,
        queue: str,
        consumer: str,
        *,
        at: int = 0,
        lease_ms: int | None = None,
        idle_timeout_ms: int | None = None,
    ) -> _Log:
        with self._lock:
            found = self._logs.get((queue, consumer))
            if found is None:
                found = _Log(
                    queue=queue,
                    consumer=consumer,
                    lease_ms=max(lease_ms or self._default_lease_ms, MIN_LEASE_MS),
                    idle_timeout_ms=idle_timeout_ms or self._default_idle_timeout_ms,
                    next_seq=at,
                    first=at,
                )
                self._logs[(queue, consumer)] = found
                log.info("consumer %s/%s created at seq %d", queue, consumer, at)
        found.last_active = self._clock()
        return found

    def _state(self, lg: _Log) -> ConsumerState:
        return ConsumerState(
            queue=lg.queue,
            consumer=lg.consumer,
            epoch=lg.epoch,
            next_seq=lg.next_seq,
            first_unacked=lg.first_unacked(),
            in_flight=len(lg.entries),
            bytes=lg.bytes,
            lease_ms=lg.lease_ms,
            idle_timeout_ms=lg.idle_timeout_ms,
            lost=lg.lost,
        )

    def total_bytes(self) -> int:
        with self._lock:
            logs = list(self._logs.values())
        return sum(lg.bytes for lg in logs)

    # -- the protocol ------------------------------------------------------------------

    def open(
        self,
        queue: str,
        consumer: str,
        *,
        lease_ms: int | None = None,
        idle_timeout_ms: int | None = None,
    ) -> ConsumerState:
        """Return the consumer's state, creating it (at sequence 0) if it does not exist.

        An existing consumer takes the given lease and idle timeout for what it pulls next.
        """
        lg = self._get_or_create(
            queue, consumer, lease_ms=lease_ms, idle_timeout_ms=idle_timeout_ms
        )
        with lg.lock:
            if lease_ms:
                lg.lease_ms = max(lease_ms, MIN_LEASE_MS)
            if idle_timeout_ms:
                lg.idle_timeout_ms = idle_timeout_ms
            return self._state(lg)

    def state(self, queue: str, consumer: str) -> ConsumerState | None:
        lg = self._get(queue, consumer)
        if lg is None:
            return None
        with lg.lock:
            return self._state(lg)

    def consumers(self, queue: str) -> list[ConsumerState]:
        with self._lock:
            logs = [lg for (q, _), lg in self._logs.items() if q == queue]
        out = []
        for lg in logs:
            with lg.lock:
                out.append(self._state(lg))
        return out

    def queue_due(self, queue: str) -> int:
        """How many items of ``queue`` are due now (0 for a queue that does not exist)."""
        try:
            return self._engine.stats(queue).due
        except QueueNotFound:
            return 0

    def pull(
        self,
        queue: str,
        consumer: str,
        *,
        after: int,
        max_items: int,
        max_new: int | None = None,
        lease_ms: int | None = None,
    ) -> PullResult:
        """Top the log up so that ``[after, end)`` holds up to ``max_items`` entries.

        Un-acknowledged entries at or above ``after`` (pulled earlier but never planned
        into a batch the caller knows of) count towards ``max_items`` and are returned
        again, so a driver that crashed between pulling and recording its offsets loses
        nothing. A log that is behind ``after`` (the server restarted) jumps forward.
        ``max_new`` caps how many items this call leases from the queue.
        """
        lg = self._get_or_create(queue, consumer, at=after, lease_ms=lease_ms)
        with lg.lock:
            if lease_ms:
                lg.lease_ms = max(lease_ms, MIN_LEASE_MS)
            if lg.next_seq < after:
                lg.next_seq = lg.first = after
            held = sum(1 for s in lg.entries if s >= after)
            want = max_items - held
            if max_new is not None:
                want = min(want, max_new)
            pulled = 0
            while want > 0 and self.total_bytes() < self._max_log_bytes:
                ask = min(want, self._max_batch)
                try:
                    got = self._engine.dequeue(queue, count=ask, lease_ms=lg.lease_ms)
                except QueueNotFound:
                    break
                for d in got:
                    lg.entries[lg.next_seq] = LogEntry(lg.next_seq, d, d.receipt, d.lease_expires)
                    lg.bytes += len(d.value)
                    lg.next_seq += 1
                pulled += len(got)
                want -= len(got)
                if len(got) < ask:
                    break
            return PullResult(lg.epoch, after, lg.next_seq, pulled, len(lg.entries))

    def read(
        self, queue: str, consumer: str, start: int, end: int
    ) -> tuple[str | None, list[LogEntry]]:
        """Entries with ``start <= seq < end`` still in the log, and the log's epoch.

        ``(None, [])`` when the consumer is unknown (the server restarted: the items are
        pending again and will be pulled into a later range).
        """
        lg = self._get(queue, consumer)
        if lg is None:
            return None, []
        with lg.lock:
            entries = lg.entries
            if end - start > len(entries):
                found = [e for s, e in entries.items() if start <= s < end]
            else:
                found = [e for s in range(start, end) if (e := entries.get(s)) is not None]
            return lg.epoch, found

    def commit(self, queue: str, consumer: str, upto: int) -> CommitResult:
        """Release every entry below ``upto``. Idempotent; creates an unknown consumer at ``upto``."""
        lg = self._get_or_create(queue, consumer, at=upto)
        with lg.lock:
            if lg.next_seq < upto:
                lg.next_seq = upto
            seqs = [s for s in lg.entries if s < upto]
            released, stale = self._release(lg, seqs)
            lg.first = max(lg.first, min(upto, lg.next_seq))
            return CommitResult(released, stale, lg.first_unacked(), lg.next_seq)

    def ack(self, queue: str, consumer: str, seqs: Sequence[int]) -> CommitResult:
        """Release the given entries; sequences not in the log are ignored."""
        lg = self._get_or_create(queue, consumer)
        with lg.lock:
            released, stale = self._release(lg, [s for s in seqs if s in lg.entries])
            return CommitResult(released, stale, lg.first_unacked(), lg.next_seq)

    def requeue(
        self,
        queue: str,
        consumer: str,
        seqs: Sequence[int] | None,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
    ) -> CommitResult:
        """Give entries back to the queue (all of them when ``seqs`` is None)."""
        lg = self._get_or_create(queue, consumer)
        with lg.lock:
            chosen = list(lg.entries) if seqs is None else [s for s in seqs if s in lg.entries]
            done, stale = self._requeue(lg, chosen, deadline, delay_ms)
            return CommitResult(done, stale, lg.first_unacked(), lg.next_seq)

    def delete(self, queue: str, consumer: str) -> bool:
        """Requeue (due now) whatever the consumer holds and forget it."""
        with self._lock:
            lg = self._logs.pop((queue, consumer), None)
        if lg is None:
            return False
        with lg.lock:
            self._requeue(lg, list(lg.entries), None, 0)
        log.info("consumer %s/%s deleted", queue, consumer)
        return True

    # -- engine batches ----------------------------------------------------------------

    def _release(self, lg: _Log, seqs: Sequence[int]) -> tuple[int, int]:
        ok = stale = 0
        for part in _chunks(seqs, self._max_batch):
            batch = [Release(lg.entries[s].delivery.id, lg.entries[s].receipt) for s in part]
            outcomes = self._engine.release(lg.queue, batch)
            for s, outcome in zip(part, outcomes, strict=True):
                lg.drop(s)
                if outcome.ok:
                    ok += 1
                else:
                    stale += 1
        return ok, stale

    def _requeue(
        self, lg: _Log, seqs: Sequence[int], deadline: int | None, delay_ms: int | None
    ) -> tuple[int, int]:
        ok = stale = 0
        for part in _chunks(seqs, self._max_batch):
            batch = [
                Requeue(lg.entries[s].delivery.id, lg.entries[s].receipt, deadline, delay_ms)
                for s in part
            ]
            outcomes = self._engine.requeue(lg.queue, batch)
            for s, outcome in zip(part, outcomes, strict=True):
                lg.drop(s)
                if outcome.ok:
                    ok += 1
                else:
                    stale += 1
        return ok, stale

    # -- leases ------------------------------------------------------------------------

    def keep_alive(self) -> int:
        """Extend leases that are past half their length; give back idle consumers' items.

        Returns how many leases were extended. An entry whose extension fails (the lease
        ran out before we got to it) is dropped from the log: its item is pending again.
        """
        with self._lock:
            logs = list(self._logs.values())
        extended = 0
        now_mono = self._clock()
        for lg in logs:
            if (now_mono - lg.last_active) * 1000 > lg.idle_timeout_ms:
                log.warning(
                    "consumer %s/%s idle for over %d ms; giving back %d items",
                    lg.queue,
                    lg.consumer,
                    lg.idle_timeout_ms,
                    len(lg.entries),
                )
                self.delete(lg.queue, lg.consumer)
                continue
            with lg.lock:
                extended += self._extend_log(lg)
        return extended

    def _extend_log(self, lg: _Log) -> int:
        # extend past half the lease, and never later than two ticks before it ends
        horizon = self._engine.now() + max(lg.lease_ms // 2, KEEPALIVE_MARGIN_MS)
        due = [s for s, e in lg.entries.items() if e.lease_expires <= horizon]
        extended = 0
        for part in _chunks(due, self._max_batch):
            batch = [
                Extend(lg.entries[s].delivery.id, lg.entries[s].receipt, lg.lease_ms) for s in part
            ]
            outcomes = self._engine.extend(lg.queue, batch)
            for s, outcome in zip(part, outcomes, strict=True):
                entry = lg.entries[s]
                if outcome.ok:
                    entry.receipt = outcome.receipt or entry.receipt
                    if outcome.lease_expires is not None:
                        entry.lease_expires = outcome.lease_expires
                    extended += 1
                else:
                    lg.drop(s)
                    lg.lost += 1
        if len(due) > extended:
            log.warning("consumer %s/%s lost %d leases", lg.queue, lg.consumer, len(due) - extended)
        return extended


def _digest(items: Sequence[NewItem]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for it in items:
        h.update(b"%d:%r:%r:" % (len(it.value), it.deadline, it.delay_ms))
        h.update(it.value)
    return h.digest()


class IdempotentBatches:
    """Remembers the result of keyed enqueue batches for ``ttl_s`` (at most ``max_keys``).

    A second request with a key seen before and the same items gets the first result
    back and enqueues nothing; concurrent requests with one key run one at a time. A
    key seen before with *different* items (a retried task whose input changed) is
    enqueued again: a duplicate is better than a lost row. Memory only: after a
    restart a retried batch is enqueued again (documented in ``docs/spark.md``).
    """

    def __init__(
        self,
        engine: EngineLike,
        *,
        ttl_s: float = 3600.0,
        max_keys: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._ttl_s = ttl_s
        self._max_keys = max_keys
        self._clock = clock
        self._done: OrderedDict[tuple[str, str], tuple[float, bytes, list[Enqueued]]] = (
            OrderedDict()
        )
        self.mismatches = 0
        self._running: dict[tuple[str, str], threading.Lock] = {}
        self._lock = threading.Lock()

    def enqueue(
        self, queue: str, key: str, items: Sequence[NewItem]
    ) -> tuple[list[Enqueued], bool]:
        """Enqueue ``items`` unless ``key`` ran before; returns (result, replayed)."""
        k = (queue, key)
        digest = _digest(items)
        with self._lock:
            self._expire()
            key_lock = self._running.setdefault(k, threading.Lock())
        with key_lock:
            with self._lock:
                hit = self._done.get(k)
            if hit is not None:
                if hit[1] == digest:
                    return hit[2], True
                self.mismatches += 1
                log.warning("batch key %r of queue %s came back with other items", key, queue)
            result = self._engine.enqueue(queue, items)
            with self._lock:
                self._done[k] = (self._clock(), digest, result)
                self._done.move_to_end(k)
                self._running.pop(k, None)
                while len(self._done) > self._max_keys:
                    self._done.popitem(last=False)
            return result, False

    def _expire(self) -> None:
        cutoff = self._clock() - self._ttl_s
        done = self._done
        while done:
            k, (at, _, _) = next(iter(done.items()))
            if at >= cutoff:
                break
            del done[k]
