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
- un-acknowledged entries are held in memory, bounded by ``max_log_bytes`` over all
  consumers, each counted as its value's length plus ``ENTRY_COST`` (so empty values
  are not free): a pull admits an entry only if it fits under the bound (or if no
  consumer holds anything, so that one value larger than the bound still moves), and
  gives back at their own deadline the items of an engine batch that did not fit.

The log lives in memory only. Dequeue writes nothing durable, so after a restart every
un-acknowledged item is pending again and is delivered again: at-least-once.

Keyed enqueue batches (the write side of Spark) live in ``server/keyed_batches.py``.

Why ~550 lines in one module: one job, the delivery log's life (open, pull, read,
commit, ack, requeue, delete, keep-alive), whose steps share one lock and one byte
account; split across files, the invariants above would have no single home.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dq.storage.errors import NotLeader, QueueNotFound
from dq.storage.types import (
    Delivery,
    Extend,
    ItemOutcome,
    QueueStats,
    Release,
    Requeue,
)

__all__ = [
    "ENTRY_COST",
    "KEEPALIVE_MARGIN_MS",
    "MIN_LEASE_MS",
    "CommitResult",
    "ConsumerGroups",
    "ConsumerState",
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
#: Bytes one log entry costs beside its value: the entry, its delivery, the item's
#: stats, the receipt string, the value's object header and the log's dict slot
#: (measured with ``sys.getsizeof`` on CPython 3.12: about 480).
ENTRY_COST = 512


class EngineLike(Protocol):
    """The part of ``storage.Engine`` this module uses."""

    def now(self) -> int: ...
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
    #: what an entry of this log cost on average (None before its first pull)
    avg_cost: float | None = None
    lost: int = 0  # entries dropped because their lease was lost
    lock: threading.Lock = field(default_factory=threading.Lock)

    def first_unacked(self) -> int:
        entries, first, end = self.entries, self.first, self.next_seq
        while first < end and first not in entries:
            first += 1
        self.first = first
        return first

    def drop(self, seq: int) -> int:
        """Forget entry ``seq``; returns the bytes it cost (0 if it was not there)."""
        entry = self.entries.pop(seq, None)
        if entry is None:
            return 0
        cost = _cost(entry.delivery)
        self.bytes -= cost
        return cost


def _cost(d: Delivery) -> int:
    return len(d.value) + ENTRY_COST


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
    #: false when the queue does not exist (never created, or misspelled)
    queue_exists: bool = True


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
        self._bytes = 0  # over every log, under ``_lock``
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
            except NotLeader:
                self.forget_all()
            except Exception:  # the thread must survive a transient engine error
                log.exception("consumer keep-alive failed")

    def forget_all(self) -> int:
        """This node became a follower of a replicated deployment: its leases are void
        (the new leader gives their items back by expiry, as after a crash) and nothing
        can be given back from here, so every log is dropped. Returns how many."""
        with self._lock:
            dropped = len(self._logs)
            self._logs.clear()
            self._bytes = 0
        if dropped:
            log.warning("this node follows another now: %d consumer logs dropped", dropped)
        return dropped

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
        """What every log holds, as counted against ``max_log_bytes``."""
        with self._lock:
            return self._bytes

    def _admit(self, cost: int) -> bool:
        """Reserve ``cost`` bytes if they fit (always when nothing is held at all)."""
        with self._lock:
            if self._bytes and self._bytes + cost > self._max_log_bytes:
                return False
            self._bytes += cost
            return True

    def _drop(self, lg: _Log, seq: int) -> None:
        cost = lg.drop(seq)
        if cost:
            with self._lock:
                self._bytes -= cost

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
            exists = True
            while want > 0 and self.total_bytes() < self._max_log_bytes:
                ask = self._ask(lg, min(want, self._max_batch))
                if ask <= 0:
                    break
                try:
                    got = self._engine.dequeue(queue, count=ask, lease_ms=lg.lease_ms)
                except QueueNotFound:
                    exists = False
                    break
                kept = self._append(lg, got)
                pulled += kept
                want -= kept
                if kept < len(got):
                    self._give_back(lg, got[kept:])
                    break
                if len(got) < ask:
                    break
            return PullResult(lg.epoch, after, lg.next_seq, pulled, len(lg.entries), exists)

    def _ask(self, lg: _Log, most: int) -> int:
        """How many items to dequeue next: what the room left fits at this log's average
        entry cost (0: nothing more fits), one while that average is unknown (so one
        batch of large values cannot lease far more than the bound holds)."""
        if lg.avg_cost is None:
            return 1
        held = self.total_bytes()
        fits = int((self._max_log_bytes - held) // lg.avg_cost)
        return min(most, fits if held else max(1, fits))

    def _append(self, lg: _Log, got: Sequence[Delivery]) -> int:
        """Log deliveries in order while they fit under the bound; returns how many."""
        for i, d in enumerate(got):
            cost = _cost(d)
            if not self._admit(cost):
                return i
            lg.entries[lg.next_seq] = LogEntry(lg.next_seq, d, d.receipt, d.lease_expires)
            lg.bytes += cost
            lg.next_seq += 1
            lg.avg_cost = cost if lg.avg_cost is None else 0.9 * lg.avg_cost + 0.1 * cost
        return len(got)

    def _give_back(self, lg: _Log, rest: Sequence[Delivery]) -> None:
        """Requeue leased items that did not fit, at their own deadline (never logged)."""
        for part in _chunks(rest, self._max_batch):
            self._engine.requeue(lg.queue, [Requeue(d.id, d.receipt, d.deadline) for d in part])

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
                self._drop(lg, s)
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
                self._drop(lg, s)
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
                    self._drop(lg, s)
                    lg.lost += 1
        if len(due) > extended:
            log.warning("consumer %s/%s lost %d leases", lg.queue, lg.consumer, len(due) - extended)
        return extended
