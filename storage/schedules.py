"""Named schedules of a queue: what an operator asks of them, and the write that fires a
tick exactly once.

A mixin of ``Engine`` (``storage/engine.py``), like ``storage/operations.py``, so that
every front end (HTTP, the CLI through it, the scheduler) calls one set of rules:

- **Definitions** (``put_schedule``, ``delete_schedule``, pause, resume) are validated
  here (``storage/schedule_times.py``), written under the queue's lock to the queue's
  directory (``storage/schedule_store.py``) before they are answered, and, on a replica
  group's leader, shipped as control frames in order with the queue's records
  (``{"op": "put_schedule", "schedule": {...}}``, ``{"op": "delete_schedule",
  "schedule": name}``) and answered once the sync set has them, as a queue's config is. A follower
  writes the same file (``_apply_schedule_control``).
- **A tick** (``fire_schedules``, called by the one scheduler of the server,
  ``storage/scheduler.py``) is an ordinary keyed enqueue: the item's deadline is the
  tick and its key ``schedule:{name}:{tick_ms}``, so replication, the dedup window,
  rates and events treat it like any other item. The same log record carries the
  schedule's progress ("schedule S fired tick T, its n-th": ``storage/itemmeta.py``),
  so a crash keeps the item and the progress or neither. Under the queue's lock a tick
  at or below the progress (durable, or on its way) is never written again; a refused
  write gives the progress back, and the scheduler tries the tick again.

The progress lives in the queue's ``ItemMeta``, rebuilt from the logs and sidecars
whenever the queue is opened: after a restart, after a full disk cleared (a failed queue
reopens from its files), and on a replica group's follower, which applies the same
records. A new leader therefore knows every tick its predecessor got committed.
"""

from __future__ import annotations

import logging
import secrets
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dq.storage import schedule_store
from dq.storage.errors import (
    InvalidArgument,
    InvalidSchedule,
    ScheduleNotFound,
    ValueTooLarge,
)
from dq.storage.itemmeta import Fired, ItemMeta, check_group, encode_schedule_entry
from dq.storage.schedule_store import CATCH_UP, Schedule, check_schedule_name
from dq.storage.schedule_times import MIN_EVERY_MS, make_timing, upcoming
from dq.storage.types import Enqueued, NewItem, QueueConfig, check_queue_name

if TYPE_CHECKING:
    from dq.storage.config import EngineConfig
    from dq.storage.queue import Queue
    from dq.storage.replication import ReplicationSink

__all__ = ["ScheduleInfo", "ScheduleOps", "ScheduleSpec", "tick_key"]

log = logging.getLogger("dq.storage.schedules")

#: next fire times a schedule's description lists
NEXT_SHOWN = 5


def tick_key(name: str, tick: int) -> str:
    """The idempotency key of the item a tick enqueues."""
    return f"schedule:{name}:{tick}"


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """A definition as a client gives it, not yet validated (``put_schedule`` does)."""

    cron: object = None
    every_ms: object = None
    at: object = None
    timezone: object = "UTC"
    start: object = None
    end: object = None
    value: bytes = b""
    #: the group of each item (``docs/delivery.md``); None: none
    group: object = None
    catch_up: object = "latest"
    paused: object = False


@dataclass(slots=True)
class ScheduleInfo:
    """A schedule as ``GET`` shows it: the definition, its progress and what is next."""

    schedule: Schedule
    #: the last tick it fired (None: none yet), and how many ticks it has fired
    last_tick: int | None
    fired: int
    #: the next fire times (none while paused)
    next: list[int]


class ScheduleOps:
    """Schedule calls of ``Engine``; see the module docstring."""

    if TYPE_CHECKING:
        config: EngineConfig
        now: Callable[[], int]
        replication: ReplicationSink | None
        _queues: dict[str, Queue]

        def _queue(self, name: str) -> Queue: ...
        def _queue_for_write(self, name: str) -> Queue: ...
        def _create(self, name: str, config: QueueConfig) -> Queue: ...
        def _check_writable(self) -> None: ...
        def _ship_control(self, name: str, op: str, **fields: Any) -> int: ...
        def _await_commit(self, lsn: int, sink: ReplicationSink | None) -> None: ...
        def enqueue_nowait(
            self, name: str, items: Sequence[NewItem], *, meta: bytes = b""
        ) -> Future[list[Enqueued]]: ...

    def _init_schedules(self) -> None:
        #: the shortest ``every_ms`` taken (the server's ``schedule_min_every_ms``)
        self.min_every_ms = MIN_EVERY_MS
        self._sched_lock = threading.RLock()
        #: definitions per queue, read from the queue's directory on first use
        self._defs: dict[str, dict[str, Schedule]] = {}
        #: told (queue, name) of every change; (queue, None): all of that queue's
        self._schedule_listeners: list[Callable[[str, str | None], None]] = []

    # ------------------------------------------------------------------ definitions

    def on_schedule_change(self, callback: Callable[[str, str | None], None]) -> None:
        """Call ``callback(queue, name)`` after each change of a definition (``name``
        None: every schedule of the queue may have changed). Keep it short: it runs on
        the changing thread."""
        self._schedule_listeners.append(callback)

    def _changed(self, queue: str, name: str | None) -> None:
        for cb in list(self._schedule_listeners):
            try:
                cb(queue, name)
            except Exception:
                log.exception("schedule listener failed")

    def _defs_of(self, queue: str) -> dict[str, Schedule]:
        """The queue's definitions (read from its directory the first time)."""
        with self._sched_lock:
            defs = self._defs.get(queue)
            if defs is not None:
                return defs
        q = self._queues.get(queue)
        if q is None:
            return {}
        loaded, problems = schedule_store.load_all(queue, q.directory)
        for line in problems:
            log.error("queue %s: unreadable schedule definition, not fired: %s", queue, line)
        with self._sched_lock:
            if self._queues.get(queue) is not q:  # deleted or replaced meanwhile
                return {}
            return self._defs.setdefault(queue, loaded)

    def all_schedules(self) -> list[Schedule]:
        """Every definition of every queue (the scheduler's start)."""
        out: list[Schedule] = []
        for queue in sorted(self._queues):
            out.extend(self._defs_of(queue).values())
        return out

    def schedules_of(self, queue: str) -> list[Schedule]:
        """The queue's definitions (none if it does not exist)."""
        return list(self._defs_of(queue).values())

    def _forget_schedules(self, queue: str | None) -> None:
        """The queue was deleted (or, with None, every queue replaced by a copy)."""
        with self._sched_lock:
            if queue is None:
                queues = list(self._defs)
                self._defs.clear()
            else:
                queues = [queue] if self._defs.pop(queue, None) is not None else []
        for name in queues:
            self._changed(name, None)
        if queue is None:
            self._changed("", None)

    def schedule(self, queue: str, name: str) -> Schedule:
        check_schedule_name(name)
        self._queue(queue)
        s = self._defs_of(queue).get(name)
        if s is None:
            raise ScheduleNotFound(f"queue {queue!r} has no schedule {name!r}", queue=queue)
        return s

    def _validated(self, queue: str, name: str, spec: ScheduleSpec, now: int) -> Schedule:
        check_queue_name(queue)
        check_schedule_name(name)
        timing = make_timing(
            cron=spec.cron,
            every_ms=spec.every_ms,
            at=spec.at,
            timezone=spec.timezone,
            start=spec.start,
            end=spec.end,
            now=now,
            min_every_ms=self.min_every_ms,
        )
        if spec.catch_up not in CATCH_UP:
            raise InvalidSchedule(
                f"catch_up must be one of {', '.join(CATCH_UP)}, not {spec.catch_up!r}",
                field="catch_up",
            )
        if not isinstance(spec.paused, bool):
            raise InvalidSchedule("paused must be true or false", field="paused")
        value = spec.value
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidSchedule("value must be bytes", field="value")
        if len(value) > self.config.max_value_bytes:
            raise ValueTooLarge(
                f"value is {len(value)} bytes; the limit is {self.config.max_value_bytes}",
                limit=self.config.max_value_bytes,
            )
        group = None
        if spec.group is not None:
            try:
                group = check_group(spec.group)
            except InvalidArgument as exc:
                raise InvalidSchedule(exc.message, field="group") from None
        return Schedule(
            queue=queue,
            name=name,
            id=0,
            timing=timing,
            value=bytes(value),
            catch_up=str(spec.catch_up),
            paused=spec.paused,
            created=now,
            since=now,
            group=group,
        )

    def put_schedule(self, queue: str, name: str, spec: ScheduleSpec) -> ScheduleInfo:
        """Create the schedule, or replace its definition (its progress stays: ticks it
        fired never fire again). Creates the queue if it does not exist. Blocks on a
        file write and, on a leader, on the sync set: call it off an event loop."""
        self._check_writable()
        now = self.now()
        fresh = self._validated(queue, name, spec, now)
        q = self._queue_for_write(queue)
        with q.lock:
            q.check_open()
            old = self._defs_of(queue).get(name)
            s = (
                replace(fresh, id=old.id, created=old.created)
                if old is not None
                else replace(fresh, id=secrets.randbits(63) or 1)
            )
            schedule_store.save(q.directory, s)
            with self._sched_lock:
                self._defs_of(queue)[name] = s
            lsn = self._ship_control(queue, "put_schedule", schedule=schedule_store.encode(s))
            sink = self.replication
        log.info("queue %s: schedule %s %s", queue, name, "replaced" if old else "created")
        self._changed(queue, name)
        self._await_commit(lsn, sink)
        return self.schedule_info(queue, name)

    def delete_schedule(self, queue: str, name: str) -> None:
        self._check_writable()
        check_schedule_name(name)
        q = self._queue(queue)
        with q.lock:
            q.check_open()
            defs = self._defs_of(queue)
            s = defs.get(name)
            if s is None:
                raise ScheduleNotFound(f"queue {queue!r} has no schedule {name!r}", queue=queue)
            schedule_store.remove(q.directory, name)
            with self._sched_lock:
                defs.pop(name, None)
            q.meta.forget_schedule(s.id)
            lsn = self._ship_control(queue, "delete_schedule", schedule=name)
            sink = self.replication
        log.info("queue %s: schedule %s deleted", queue, name)
        self._changed(queue, name)
        self._await_commit(lsn, sink)

    def set_schedule_paused(self, queue: str, name: str, paused: bool) -> ScheduleInfo:
        """Pause (fire nothing) or resume a schedule, durably. Resuming does not fire the
        ticks that passed while paused: they were not missed, they were not wanted."""
        self._check_writable()
        check_schedule_name(name)
        q = self._queue(queue)
        lsn = 0
        with q.lock:
            q.check_open()
            s = self._defs_of(queue).get(name)
            if s is None:
                raise ScheduleNotFound(f"queue {queue!r} has no schedule {name!r}", queue=queue)
            if s.paused != paused:
                s = replace(s, paused=paused, since=self.now())
                schedule_store.save(q.directory, s)
                with self._sched_lock:
                    self._defs_of(queue)[name] = s
                lsn = self._ship_control(queue, "put_schedule", schedule=schedule_store.encode(s))
            sink = self.replication
        self._changed(queue, name)
        self._await_commit(lsn, sink)
        return self.schedule_info(queue, name)

    def schedule_progress(self, queue: str, schedule_id: int) -> Fired | None:
        """What the schedule has fired in ``queue`` (its record on its way included)."""
        q = self._queues.get(queue)
        if q is None:
            return None
        return q.meta.fired.get(schedule_id)

    def schedule_info(self, queue: str, name: str) -> ScheduleInfo:
        s = self.schedule(queue, name)
        return self._info(s)

    def list_schedules(self, queue: str) -> list[ScheduleInfo]:
        self._queue(queue)
        return [self._info(s) for _, s in sorted(self._defs_of(queue).items())]

    def schedules_page(
        self, after: tuple[str, str] | None, limit: int
    ) -> tuple[list[ScheduleInfo], tuple[str, str] | None]:
        """A page of every queue's schedules in (queue, name) order, strictly after
        ``after``; the last one's (queue, name) if more follow (the next page's
        ``after``), else None."""
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 1000:
            raise InvalidArgument("limit must be between 1 and 1000", limit=limit)
        keys = sorted((s.queue, s.name) for s in self.all_schedules())
        start = 0 if after is None else bisect_right(keys, after)
        page = keys[start : start + limit]
        infos = []
        for queue, name in page:
            s = self._defs_of(queue).get(name)
            if s is not None:  # deleted meanwhile
                infos.append(self._info(s))
        more = start + limit < len(keys)
        return infos, (page[-1] if more and page else None)

    def _info(self, s: Schedule) -> ScheduleInfo:
        f = self.schedule_progress(s.queue, s.id)
        last = f.tick if f is not None and f.tick else None
        after = max(last or 0, s.since, self.now())
        nxt = [] if s.paused else upcoming(s.timing, after, NEXT_SHOWN)
        return ScheduleInfo(s, last, f.count if f is not None else 0, nxt)

    # ------------------------------------------------------------------ firing

    def run_schedule(self, queue: str, name: str) -> tuple[Enqueued, str]:
        """Enqueue the schedule's item now, outside its ticks (its progress is not
        touched), with the key ``schedule:{name}:run:{now}``; the item and its key.
        Waits until it is durable."""
        self._check_writable()
        s = self.schedule(queue, name)
        now = self.now()
        key = f"schedule:{name}:run:{now}"
        item = NewItem(s.value, deadline=now, key=key, group=s.group)
        [done] = self.enqueue_nowait(queue, [item]).result(self.config.wait_timeout_s)
        return done, key

    def fire_schedules(
        self, queue: str, picks: Sequence[tuple[Schedule, Sequence[int]]]
    ) -> tuple[Future[list[Enqueued]] | None, list[tuple[Schedule, list[int]]]]:
        """Enqueue one item per tick (ticks of each schedule ascending, at most
        ``max_batch`` items in all) in one log record that also carries each schedule's
        new progress. A tick at or below a schedule's progress is left out.

        Returns the write's future (None: nothing left to write) and what it holds.
        Raises what the enqueue raises (nothing was written then)."""
        q = self._queue_for_write(queue)
        with q.lock:
            # a failed queue reopens from its files here, before its progress is read (a
            # reopening inside the enqueue would replace the ``ItemMeta`` noted below)
            q.check_open()
            meta = q.meta
            items: list[NewItem] = []
            entries: list[bytes] = []
            noted: list[tuple[int, int, int]] = []
            written: list[tuple[Schedule, list[int]]] = []
            before: dict[int, Fired | None] = {}
            for s, ticks in picks:
                f = meta.fired.get(s.id)
                done = f.tick if f is not None else 0
                fresh = [t for t in ticks if t > done]
                if not fresh:
                    continue
                count = f.count if f is not None else 0
                for t in fresh:
                    items.append(
                        NewItem(s.value, deadline=t, key=tick_key(s.name, t), group=s.group)
                    )
                count += len(fresh)
                entries.append(encode_schedule_entry(s.id, fresh[-1], count, s.name))
                noted.append((s.id, fresh[-1], count))
                written.append((s, fresh))
                before[s.id] = None if f is None else Fired(f.tick, f.count, 0, 0)
            if not items:
                return None, []
            for sid, tick, count in noted:
                meta.note_fired(sid, tick, count)
            try:
                fut = self.enqueue_nowait(queue, items, meta=b"".join(entries))
            except BaseException:
                for sid, prev in before.items():  # nothing was written: as it was
                    cur = meta.fired.get(sid)
                    if prev is None:
                        if cur is not None and cur.durable_tick == 0:
                            del meta.fired[sid]
                        elif cur is not None:
                            cur.tick, cur.count = cur.durable_tick, cur.durable_count
                    elif cur is not None:
                        cur.tick, cur.count = prev.tick, prev.count
                raise
        for sid, tick, count in noted:
            fut.add_done_callback(_settle(meta, sid, tick, count))
        return fut, written

    # ------------------------------------------------------------------ follower

    def _apply_schedule_control(self, queue: str, op: dict[str, Any]) -> bool:
        """Apply a leader's schedule change (a follower); False if ``op`` is not one."""
        kind = op["op"]
        if kind not in ("put_schedule", "delete_schedule"):
            return False
        q = self._queues.get(queue)
        if q is None:
            if kind == "delete_schedule":
                return True
            q = self._create(queue, QueueConfig())
        with q.lock:
            if kind == "put_schedule":
                s = schedule_store.decode(queue, op["schedule"])
                schedule_store.save(q.directory, s)
                with self._sched_lock:
                    self._defs_of(queue)[s.name] = s
                name = s.name
            else:
                name = str(op["schedule"])
                old = self._defs_of(queue).get(name)
                schedule_store.remove(q.directory, name)
                with self._sched_lock:
                    self._defs_of(queue).pop(name, None)
                if old is not None:
                    q.meta.forget_schedule(old.id)
        self._changed(queue, name)
        return True


def _settle(meta: ItemMeta, sid: int, tick: int, count: int) -> Callable[[Future[Any]], None]:
    def settled(fut: Future[Any]) -> None:
        meta.fired_settled(sid, tick, count, fut)

    return settled
