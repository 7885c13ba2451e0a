"""The server's one timer for every schedule: a heap of next fire times.

One thread (``dq-scheduler``) sleeps until the earliest next tick of all schedules (or
a definition changes), fires every tick then due, and sleeps again: no thread or task
per schedule, so 100,000 schedules cost a heap entry and a small object each, and an
idle server wakes only for a tick. Each firing is one keyed enqueue per queue through
the engine (``Engine.fire_schedules``), which writes the schedule's progress in the
same record and never writes a tick twice; this module decides *which* ticks are due.

Only a node that takes writes fires (one alone, or a replica group's leader:
``engine.writable``). Its **term** starts when it begins to take writes (or leads a new
epoch: a new replicator); a tick before
the term's start was missed while no node fired it (downtime, an election), and the
schedule's ``catch_up`` says what becomes of such ticks:

- ``skip``: none fires;
- ``latest`` (the default): the latest one fires, the others never;
- ``all``: every one fires, at most the newest ``CATCH_UP_LIMIT`` (1,000); the older are
  skipped with a warning in the log.

A tick within the term always fires, however late: a write refused (a full disk, a
stalled replica group, a write stall) is tried again with a backoff (50 ms doubling to
5 s) until it is written, the ticks in order, at most the newest 1,000 outstanding per
schedule. Progress is read from the queue (``Engine.schedule_progress``) at each firing,
so after a queue reopened from its files (a fault cleared) or a new term the decision
rests on what is durable, never on this module's memory.

The clock is injectable (``clock``) and ``step(now)`` runs one round without the
thread, so tests drive days of ticks (daylight saving in Europe/Berlin) in milliseconds.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dq.storage.errors import NotLeader, QueueNotFound, ReplicationTimeout, StorageError
from dq.storage.schedule_store import Schedule
from dq.storage.schedule_times import next_after, ticks_between

if TYPE_CHECKING:
    from dq.storage.engine import Engine

__all__ = ["CATCH_UP_LIMIT", "LATENESS_BUCKETS", "Scheduler", "SchedulerStats"]

log = logging.getLogger("dq.storage.scheduler")

#: missed (or outstanding) ticks one schedule fires at most at once; older are skipped
CATCH_UP_LIMIT = 1000
#: upper bounds (seconds) of the lateness histogram: tick time -> item durable
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0)
_RETRY_FIRST_MS = 50
_RETRY_MAX_MS = 5000
#: how long the thread sleeps at most with nothing due (it wakes for any change)
_IDLE_S = 30.0
#: how often a node that does not take writes looks whether it has started to
_FOLLOWER_POLL_S = 0.2

Key = tuple[str, str]  # (queue, name)


@dataclass(slots=True)
class SchedulerStats:
    """What ``/metrics`` shows (read without the lock: plain numbers)."""

    schedules: int = 0
    #: ticks written (durable), of which fired after downtime (``catch_up``)
    fired: int = 0
    caught_up: int = 0
    #: ticks never fired: missed with ``skip``, older than ``latest``'s, past the limit
    skipped: int = 0
    #: writes refused (then tried again)
    failed_writes: int = 0
    #: writes on their way to disk now
    in_flight: int = 0
    #: lateness of ticks fired within their term: counts per bucket (+Inf last) and sum
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENESS_BUCKETS) + 1))
    lateness_sum: float = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bisect_left(LATENESS_BUCKETS, seconds)] += 1
        self.lateness_sum += seconds


@dataclass(slots=True)
class _Entry:
    schedule: Schedule
    #: the heap position it holds (None: none, e.g. paused or finished)
    due: int | None = None
    seq: int = 0
    #: ticks at or below this are not fired this term (``skip`` moved it past the missed)
    floor: int = 0
    #: a refused write's backoff (ms; 0: none)
    retry_ms: int = 0
    #: the lateness of its last tick fired within the term (ms)
    lateness_ms: int | None = None
    #: a write of its ticks is on its way: no second one meanwhile
    writing: bool = False


#: ticks looked for forward from the last one fired before looking back from now instead
_FORWARD = 16


def _forward(s: Schedule, after: int, upto: int) -> tuple[list[int] | None, int]:
    """The ticks in (``after``, ``upto``] found going forward (``next_after``, cached per
    expression and instant, so schedules sharing a cron share the work); None when
    there are more than ``_FORWARD``."""
    out: list[int] = []
    tick = next_after(s.timing, after)
    while tick is not None and tick <= upto:
        if len(out) == _FORWARD:
            return None, 0
        out.append(tick)
        tick = next_after(s.timing, tick)
    return out, 0


class Scheduler:
    """See the module docstring. ``start()`` runs the thread; tests may call ``step``.

    Threads: the heap and the entries are the scheduler thread's alone (or the caller's
    of ``step``, with no thread running). Other threads only leave it mail — a changed
    definition (the engine's listener), a write answered (the committing thread's
    callback) — under ``_mail``, a lock held for a list append, and wake it with
    ``_wake``: the thread that commits the log never waits for the scheduler's work."""

    def __init__(self, engine: Engine, clock: Callable[[], int] | None = None) -> None:
        self.engine = engine
        self.clock = clock or engine.now
        self.stats = SchedulerStats()
        #: guards the mail (``_changes``, ``_answered``) and the counters others update
        self._mail = threading.Lock()
        self._wake = threading.Event()
        #: the replicator the term began under: a new one (a new epoch) is a new term
        self._sink: object = None
        self._heap: list[tuple[int, int, str, str]] = []
        self._entries: dict[Key, _Entry] = {}
        #: changes told by the engine, applied by the thread: (queue, name or None)
        self._changes: set[tuple[str, str | None]] = set()
        #: writes answered (by the committing thread): their entries, the refusal (None:
        #: written or in doubt) and each schedule's lateness; the scheduler's thread
        #: places the entries again
        self._answered: list[tuple[list[_Entry], BaseException | None, dict[Key, int]]] = []
        self._seq = itertools.count(1)
        #: when this node began firing (None: it does not take writes now)
        self.term: int | None = None
        self._stop = False
        self._thread: threading.Thread | None = None
        engine.on_schedule_change(self._told)

    # ------------------------------------------------------------------ thread

    def start(self) -> Scheduler:
        self._thread = threading.Thread(target=self._run, name="dq-scheduler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _told(self, queue: str, name: str | None) -> None:
        with self._mail:
            self._changes.add((queue, name))
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.clear()  # mail from here on wakes the wait below at once
            try:
                wait = self._turn()
            except Exception:
                log.exception("the scheduler's round failed; trying again in 1 s")
                wait = 1.0
            if wait > 0:
                self._wake.wait(wait)

    def _turn(self) -> float:
        """One round of the thread: the seconds to sleep after it."""
        engine = self.engine
        if engine.closed or not engine.writable:
            if self.term is not None:
                log.info("scheduler: this node no longer takes writes; it fires nothing")
                self.end_term()
            return _FOLLOWER_POLL_S
        now = self.clock()
        if self.term is None or engine.replication is not self._sink:
            self.begin_term(now)  # this node began taking writes, or leads a new epoch
            now = self.clock()
        nxt = self.step(now)
        if nxt is None:
            return _IDLE_S
        return min(_IDLE_S, max(0.0, (nxt - self.clock()) / 1000))

    # ------------------------------------------------------------------ terms

    def begin_term(self, now: int) -> None:
        """This node takes writes from ``now`` on: every schedule is read afresh."""
        with self._mail:
            self._changes.clear()
            self._answered.clear()
        self._sink = self.engine.replication
        entries: dict[Key, _Entry] = {}
        heap: list[tuple[int, int, str, str]] = []
        for s in self.engine.all_schedules():
            e = entries[(s.queue, s.name)] = _Entry(s)
            item = self._position(e, now)
            if item is not None:
                heap.append(item)
        heapq.heapify(heap)
        self.term = now
        self._entries = entries
        self._heap = heap
        self.stats.schedules = len(entries)
        log.info("scheduler: firing %d schedule(s) from %d on", len(entries), now)

    def end_term(self) -> None:
        self.term = None
        self._entries = {}
        self._heap = []
        self.stats.schedules = 0

    def _position(self, e: _Entry, now: int) -> tuple[int, int, str, str] | None:
        """Compute the entry's next due time; its heap item (None: nothing to wait for).
        Earlier items of the entry become stale (their ``seq`` no longer matches)."""
        s = e.schedule
        e.seq = next(self._seq)
        e.due = None
        if s.paused or e.writing:
            return None
        if e.retry_ms:
            e.due = now + e.retry_ms
        else:
            f = self.engine.schedule_progress(s.queue, s.id)
            after = max(f.tick if f is not None else 0, s.since, e.floor)
            e.due = next_after(s.timing, after)
        if e.due is None:
            return None
        return (e.due, e.seq, s.queue, s.name)

    def _apply_changes(self, now: int) -> None:
        with self._mail:
            changes, self._changes = self._changes, set()
        if not changes:
            return
        if ("", None) in changes:  # every queue replaced: start over
            self.begin_term(now)
            return
        for queue, name in changes:
            if name is None:
                wanted = {s.name: s for s in self.engine.schedules_of(queue)}
                keys = [k for k in self._entries if k[0] == queue] + [(queue, n) for n in wanted]
            else:
                try:
                    wanted = {name: self.engine.schedule(queue, name)}
                except (QueueNotFound, StorageError):
                    wanted = {}
                keys = [(queue, name)]
            for key in set(keys):
                s = wanted.get(key[1])
                e = self._entries.get(key)
                if s is None:
                    self._entries.pop(key, None)
                    continue
                if e is None:
                    e = self._entries[key] = _Entry(s)
                elif e.schedule != s:
                    if e.schedule.id != s.id or e.schedule.since != s.since:
                        e.floor = 0
                    e.schedule = s
                    e.retry_ms = 0
                self._push(e, now)
            self.stats.schedules = len(self._entries)

    def _push(self, e: _Entry, now: int) -> None:
        """Give the entry its next heap position."""
        item = self._position(e, now)
        if item is not None:
            heapq.heappush(self._heap, item)

    def _settle_answered(self, now: int) -> None:
        with self._mail:
            answered, self._answered = self._answered, []
        for entries, refused, late in answered:
            if refused is not None:
                self._retry(entries, refused)
            for e in entries:
                e.writing = False
                key = (e.schedule.queue, e.schedule.name)
                if refused is None:
                    e.retry_ms = 0
                    if key in late:
                        e.lateness_ms = late[key]
                if self._entries.get(key) is e:
                    self._push(e, now)

    # ------------------------------------------------------------------ firing

    def step(self, now: int | None = None) -> int | None:
        """Fire every tick due at ``now`` (the clock's if None); the next due time."""
        if now is None:
            now = self.clock()
        if self.term is None:
            self.begin_term(now)
        self._apply_changes(now)
        self._settle_answered(now)
        due: list[_Entry] = []
        heap = self._heap
        while heap and heap[0][0] <= now:
            _d, seq, queue, name = heapq.heappop(heap)
            e = self._entries.get((queue, name))
            if e is not None and e.seq == seq:
                e.due = None
                due.append(e)
        if due:
            self._fire(due, now)
            self._settle_answered(now)  # writes that were answered at once
        while heap:
            d, seq, queue, name = heap[0]
            e = self._entries.get((queue, name))
            if e is not None and e.seq == seq:
                return d
            heapq.heappop(heap)
        return None

    def _ticks(self, e: _Entry, now: int) -> list[int]:
        """The ticks of ``e`` to fire at ``now``: missed ones per ``catch_up``, then
        every one within the term (the newest 1,000 at most)."""
        s = e.schedule
        term = self.term if self.term is not None else now
        f = self.engine.schedule_progress(s.queue, s.id)
        lower = max(f.tick if f is not None else 0, s.since, e.floor)
        chosen: list[int] = []
        if lower < term - 1:
            missed, older = ticks_between(s.timing, lower, min(now, term - 1), CATCH_UP_LIMIT)
            if s.catch_up == "skip":
                dropped = len(missed) + older
                e.floor = max(e.floor, term - 1)
                missed = []
            elif s.catch_up == "latest":
                dropped = len(missed) - 1 + older if missed else 0
                missed = missed[-1:]
            else:
                dropped = older
            if dropped:
                self.stats.skipped += dropped
                log.warning(
                    "queue %s: schedule %s missed %s%d tick(s) while no server fired it; "
                    "catch_up %s fires %d of them",
                    s.queue,
                    s.name,
                    "at least " if older and s.timing.cron is not None else "",
                    dropped + len(missed),
                    s.catch_up,
                    len(missed),
                )
            chosen = missed
            lower = max(lower, term - 1)
        current, older = _forward(s, lower, now)
        if current is None:  # many outstanding: the newest, looking back from now
            current, older = ticks_between(s.timing, lower, now, CATCH_UP_LIMIT)
        if older:
            self.stats.skipped += older
            log.warning(
                "queue %s: schedule %s has over %d ticks outstanding; the %d oldest skipped",
                s.queue,
                s.name,
                CATCH_UP_LIMIT,
                older,
            )
        ticks = chosen + current
        if len(ticks) > CATCH_UP_LIMIT:
            self.stats.skipped += len(ticks) - CATCH_UP_LIMIT
            ticks = ticks[-CATCH_UP_LIMIT:]
        return ticks

    def _fire(self, due: list[_Entry], now: int) -> None:
        by_queue: dict[str, list[tuple[_Entry, list[int]]]] = defaultdict(list)
        idle: list[_Entry] = []
        for e in due:
            ticks = self._ticks(e, now)
            if ticks:
                by_queue[e.schedule.queue].append((e, ticks))
            else:
                idle.append(e)
        limit = self.engine.config.max_batch
        for queue, picks in by_queue.items():
            chunk: list[tuple[_Entry, list[int]]] = []
            size = 0
            for e, ticks in picks:
                for i in range(0, len(ticks), limit):
                    part = ticks[i : i + limit]
                    if size + len(part) > limit and chunk:
                        self._write(queue, chunk, now)
                        chunk, size = [], 0
                    chunk.append((e, part))
                    size += len(part)
            if chunk:
                self._write(queue, chunk, now)
        for e in idle:
            item = self._position(e, now)
            if item is not None:
                if item[0] <= now:  # nothing to fire yet due: never spin on it
                    e.due = now + 1000
                    item = (e.due, e.seq, item[2], item[3])
                heapq.heappush(self._heap, item)

    def _write(self, queue: str, chunk: list[tuple[_Entry, list[int]]], now: int) -> None:
        entries = [e for e, _ in chunk]
        try:
            fut, written = self.engine.fire_schedules(
                queue, [(e.schedule, ticks) for e, ticks in chunk]
            )
        except NotLeader:
            self.end_term()
            return
        except QueueNotFound:
            for e in entries:
                self._entries.pop((e.schedule.queue, e.schedule.name), None)
            return
        except StorageError as exc:
            with self._mail:
                self.stats.failed_writes += 1
            self._retry(entries, exc)
            for e in entries:
                self._push(e, now)
            return
        if fut is None:
            for e in entries:
                e.retry_ms = 0
                self._push(e, now)
            return
        term = self.term if self.term is not None else now
        for e in entries:
            e.writing = True
        with self._mail:
            self.stats.in_flight += 1
        fut.add_done_callback(lambda f: self._written(f, entries, written, term))

    def _retry(self, entries: list[_Entry], exc: BaseException) -> None:
        """The write was refused: each schedule tries again after its backoff (50 ms
        doubling to 5 s); said in the log at the first refusal of a run of them."""
        for e in entries:
            e.retry_ms = min(_RETRY_MAX_MS, max(_RETRY_FIRST_MS, e.retry_ms * 2))
        first = entries[0].schedule
        if entries[0].retry_ms <= _RETRY_FIRST_MS:
            log.warning(
                "queue %s: ticks of schedule %s%s could not be written (%s); trying again",
                first.queue,
                first.name,
                f" and {len(entries) - 1} more" if len(entries) > 1 else "",
                exc,
            )

    def _written(
        self,
        fut: Future[Any],
        entries: list[_Entry],
        written: list[tuple[Schedule, list[int]]],
        term: int,
    ) -> None:
        """A write was answered (on the committing thread): count it and leave the
        entries to the scheduler's thread, which places them again."""
        now = self.clock()
        error = None if fut.cancelled() else fut.exception()
        refused = error if error is not None and not isinstance(error, ReplicationTimeout) else None
        late: dict[Key, int] = {}
        with self._mail:
            stats = self.stats
            stats.in_flight -= 1
            if refused is not None:
                stats.failed_writes += 1
            elif error is None:
                for s, ticks in written:
                    stats.fired += len(ticks)
                    for t in ticks:
                        if t >= term:
                            stats.observe(max(0, now - t) / 1000)
                            late[(s.queue, s.name)] = now - t
                        else:
                            stats.caught_up += 1
            self._answered.append((entries, refused, late))
        self._wake.set()

    # ------------------------------------------------------------------ reading

    def lateness_ms(self, queue: str, name: str) -> int | None:
        """The lateness of the schedule's last tick fired by this node (None: none yet)."""
        e = self._entries.get((queue, name))
        return None if e is None else e.lateness_ms
