"""The engine: a data directory of queues, opened once per process.

    data_dir/
      LOCK                  flock'd by the owning process
      queues/<name>/        one directory per queue: queue.json, logs, segment files

It validates input (so bad input is refused before anything is written), routes
operations to queues, owns the group-commit syncer and the compactor, and carries
items between queues when they are dead-lettered. Thread-safe: each queue has its
own lock; the engine lock only guards the set of queues.

Why ~500 lines in one module: it is the engine's one public face, and every entry point
(enqueue, dequeue, release, requeue, extend, queue admin) validates its input here the
same way before a queue sees it; the operator's operations live apart in
``storage/operations.py`` and the per-queue work in the ``storage/queue*.py`` modules.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import resource
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from dq.storage import fileio
from dq.storage.codec import MAX_DEADLINE, decode_stats, key_id
from dq.storage.compactor import Compactor
from dq.storage.config import EngineConfig
from dq.storage.errors import (
    BrokenRule,
    ConfigConflict,
    DataDirLocked,
    DeadLetterQueueInUse,
    EngineUnavailable,
    InvalidArgument,
    QueueNotFound,
    StorageError,
    StorageFull,
    TooManyQueues,
    ValueTooLarge,
    WriteStall,
)
from dq.storage.events import Event
from dq.storage.itemmeta import check_group, check_key, intern_group
from dq.storage.keyops import KeyOps
from dq.storage.merge_policy import MergePolicy, MergeSource
from dq.storage.moved import MovedItems
from dq.storage.operations import MAX_DEDUP_WINDOW_MS, Operations, effective_dead_letter_queue
from dq.storage.queue import Queue
from dq.storage.queue_config import check_rules, config_to_json
from dq.storage.reasons import Reason, check_error
from dq.storage.replica_engine import SCRATCH_PREFIX, ReplicaEngine, restore_replaced_queues
from dq.storage.retry import retry_from_json
from dq.storage.schedules import ScheduleOps
from dq.storage.syncer import FsyncStats, InlineCommits, Syncer
from dq.storage.types import (
    ON_DUPLICATE,
    DeadEntry,
    Delivery,
    Enqueued,
    Extend,
    Fail,
    ItemOutcome,
    NewItem,
    QueueConfig,
    QueueStats,
    Release,
    Requeue,
    check_queue_name,
)
from dq.storage.validation import (
    DEFAULT_LEASE_MS,
    check_batch,
    check_lease_ms,
    count_range,
    resolve_deadline,
)
from dq.storage.write_future import resolved

__all__ = ["Engine", "EngineConfig"]

log = logging.getLogger(__name__)


def _remover(callbacks: list[Any], callback: Any) -> Callable[[], None]:
    """An idempotent unsubscribe for ``callback`` in ``callbacks``."""

    def unsubscribe() -> None:
        try:
            callbacks.remove(callback)
        except ValueError:
            pass

    return unsubscribe


def _raise_fd_limit() -> None:
    """Each segment file holds a descriptor open: take the hard limit, as servers do."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            log.info("could not raise the open-file limit above %d", soft)


def _make_data_dir(root: str) -> None:
    """Create ``root/queues`` if it is missing, durably: a directory's name lasts
    through a power loss only once its parent directory is fsynced."""
    queues = os.path.join(root, "queues")
    if os.path.isdir(queues):
        return
    if restore_replaced_queues(root):
        return
    created_root = not os.path.isdir(root)
    os.makedirs(queues, exist_ok=True)
    fileio.fsync_dir(root)
    if created_root:
        fileio.fsync_dir(os.path.dirname(root))


def _creation_error(name: str, exc: OSError) -> StorageError:
    """What a queue creation that hit an I/O error answers: 507 when the disk is full,
    else 503 (the caller may retry; nothing of the queue was left behind)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFull(f"creating the queue failed: {exc}", queue=name)
    return EngineUnavailable(f"creating the queue failed: {exc}", queue=name)


def _system_clock() -> int:
    return time.time_ns() // 1_000_000


class Engine(Operations, KeyOps, ReplicaEngine, ScheduleOps):
    def __init__(
        self, root: str, config: EngineConfig, clock: Callable[[], int] | None, lock_fd: int
    ) -> None:
        self.root = root
        self.config = config
        self.now: Callable[[], int] = clock or _system_clock
        self._lock_fd = lock_fd
        self._lock = threading.RLock()
        self._queues: dict[str, Queue] = {}
        self.fsync_stats = FsyncStats()
        self.syncer: Syncer | None = (
            Syncer(config.fsync, config.fsync_interval_ms) if config.fsync != "never" else None
        )
        self.compactor = Compactor(config.compaction)
        self.merge_policy = MergePolicy()
        #: where dead-lettered and redriven items went, for peeks of their old ids
        self.moved = MovedItems()
        #: (callback, wanted): ``wanted()`` False skips the callback and, when no one
        #: wants it, building the event at all
        self._listeners: list[tuple[Callable[[Event], None], Callable[[], bool] | None]] = []
        self.closed = False
        self._init_replica()
        self._init_schedules()
        self._stop_maintenance = threading.Event()
        self._maintenance: threading.Thread | None = threading.Thread(
            target=self._maintain, name="dq-maintenance", daemon=True
        )

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def open(
        cls,
        data_dir: str | Path,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], int] | None = None,
    ) -> Engine:
        root = os.path.abspath(str(data_dir))
        _make_data_dir(root)
        _raise_fd_limit()
        lock_path = os.path.join(root, "LOCK")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DataDirLocked("another process has this data directory open", path=root) from None
        engine = cls(root, config or EngineConfig(), clock, fd)
        try:
            for name in os.listdir(root):  # a replica copy cut short by a crash
                if name.startswith(SCRATCH_PREFIX):
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            engine._open_queues()
        except BaseException:
            engine.close()
            raise
        if engine._maintenance is not None:
            engine._maintenance.start()
        return engine

    def _open_queues(self) -> None:
        """Open every queue directory (on start, and after a replica's copy replaced them)."""
        qroot = os.path.join(self.root, "queues")
        for name in sorted(os.listdir(qroot)):
            path = os.path.join(qroot, name)
            if name.startswith(".deleted-"):  # no queue name starts with a dot
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.isfile(os.path.join(path, "queue.json")) or (
                not name.startswith(".") and _holds_data(path)
            ):
                # never raises for one queue's damage: it is quarantined instead (a
                # directory holding logs or segments without its queue.json too: taken
                # for an interrupted creation, the next enqueue would create the queue
                # afresh in it, reuse ids from 1, and its new log 1 would be deleted at
                # the next start as covered by the old 1-1.seg)
                self._queues[name] = Queue.open(self, name, path)
            elif os.path.isdir(path):
                log.warning("ignoring %s: no queue.json (creation was interrupted)", path)

    def _maintain(self) -> None:
        """Background upkeep: reopen failed queues once their fault clears; with
        ``auto_merge``, freeze idle logs that hold tombstones and start merges."""
        while not self._stop_maintenance.wait(0.5):
            self._maintain_queues()

    def _maintain_queues(self) -> None:
        """One pass of ``_maintain``: a call of its own, so that no queue stays named
        by the thread while it waits for the next (a deleted queue is let go at once)."""
        for q in list(self._queues.values()):
            try:
                q.recover_if_due()
                if self.config.auto_merge:
                    q.jobs.freeze_if_idle(self.config.idle_freeze_seconds)
                    self.merge_policy.consider(q)
                self.forget_expired_keys(q)
            except Exception:
                log.exception("maintenance of queue %s failed", q.name)

    def close(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.closed = True
            queues = list(self._queues.values())
        self._stop_maintenance.set()
        if self._maintenance is not None and self._maintenance.is_alive():
            self._maintenance.join(timeout=30)
        if self.syncer is not None:
            self.syncer.stop()
        for q in queues:
            q.close()
        self.compactor.shutdown()
        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        os.close(self._lock_fd)
        self._let_go()

    def _let_go(self) -> None:
        """Drop what points back at the engine: its queues (each holds the engine) and
        the subscribers' callbacks (a subscriber holds the engine too). Each is a
        reference cycle that would keep the closed engine — every queue's in-memory
        segments, delivery index and segment readers — until the cycle collector ran,
        which a process allocating few Python objects may not do for a long time;
        without them the engine goes as soon as its last name does. A closed engine
        answers ``EngineUnavailable`` for its queues from now on, as it did for new
        ones."""
        with self._lock:
            self._queues.clear()
        self._listeners.clear()
        self._schedule_listeners.clear()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ queues

    def _queue(self, name: str) -> Queue:
        q = self._queues.get(name)
        if q is None:
            check_queue_name(name)
            if self.closed:
                raise EngineUnavailable("engine is closed")
            raise QueueNotFound("no such queue", queue=name)
        return q

    def _queue_for_write(self, name: str) -> Queue:
        self._check_writable()
        q = self._queues.get(name)
        if q is not None:
            return q
        check_queue_name(name)
        return self._create(name, QueueConfig())

    def _create(self, name: str, config: QueueConfig) -> Queue:
        with self._lock:
            if self.closed:
                raise EngineUnavailable("engine is closed")
            q = self._queues.get(name)
            if q is None:
                if len(self._queues) >= self.config.max_queues:
                    raise TooManyQueues(
                        f"this server holds at most {self.config.max_queues} queues",
                        queue=name,
                        limit=self.config.max_queues,
                    )
                directory = os.path.join(self.root, "queues", name)
                try:
                    q = Queue.create(self, name, directory, config)
                except BaseException as exc:  # all or nothing: no half-made queue stays behind
                    shutil.rmtree(directory, ignore_errors=True)
                    if isinstance(exc, OSError):  # every engine failure is a StorageError
                        raise _creation_error(name, exc) from exc
                    raise
                # shipped before any record of the queue can be (ordered by the lock)
                shipped = self._ship_control(name, "put_queue", config=config_to_json(config))
                q.leader.last_lsn = shipped
                self._queues[name] = q
                self.emit("queue_created", name, [])
            return q

    def has_queue(self, name: str) -> bool:
        return name in self._queues

    def ensure_queue(self, name: str) -> None:
        """Create ``name`` with the default config unless it exists.

        Creating a queue writes and fsyncs its directory, config and first log (a few
        milliseconds): an event loop should call this in a worker thread before the
        first write to a new queue (``has_queue`` says when), rather than let
        ``enqueue_nowait`` create the queue on the loop.
        """
        self._queue_for_write(name)

    def list_queues(self) -> list[str]:
        return sorted(self._queues)

    def get_queue(self, name: str) -> QueueConfig:
        return self._queue(name).config

    def put_queue(self, name: str, config: QueueConfig) -> QueueConfig:
        """Create the queue with ``config``, or replace the config of an existing one."""
        self._check_writable()
        check_queue_name(name)
        self._validate_config(name, config)
        with self._lock:
            existing = self._queues.get(name)
            if existing is None:
                created = self._create(name, config)
                lsn, sink = created.leader.last_lsn, self.replication
        if existing is None:
            # waited for with no engine lock held: a node that stops leading swaps the
            # sink (``set_replication``) meanwhile, and a snapshot lists the queues
            self._await_commit(lsn, sink)
            return created.config
        q = existing
        with q.lock:
            if q.quarantined and q.failed is not None:
                raise q.failed
            q.set_config(config)
            lsn = self._ship_control(name, "put_queue", config=config_to_json(config))
            sink = self.replication
        self._await_commit(lsn, sink)
        return config

    def _validate_config(self, name: str, config: QueueConfig) -> None:
        check_lease_ms(config.default_lease_ms, DEFAULT_LEASE_MS)
        check_rules(config)
        if config.max_deliveries is not None and (
            not isinstance(config.max_deliveries, int) or config.max_deliveries < 1
        ):
            raise InvalidArgument("max_deliveries must be a positive integer or null")
        window = config.dedup_window_ms
        if (
            not isinstance(window, int)
            or isinstance(window, bool)
            or not 0 <= window <= MAX_DEDUP_WINDOW_MS
        ):
            raise InvalidArgument(
                f"dedup_window_ms must be between 0 (off) and {MAX_DEDUP_WINDOW_MS}",
                dedup_window_ms=window,
            )
        retry_from_json(config.retry)  # a policy built in code keeps the API's bounds too
        if config.dead_letter_queue is not None:
            check_queue_name(config.dead_letter_queue)
            if config.dead_letter_queue == name:
                raise ConfigConflict("a queue cannot be its own dead-letter queue", queue=name)
        self._check_dead_letter_cycle(name, config)

    def _check_dead_letter_cycle(self, name: str, config: QueueConfig) -> None:
        """Refuse a config whose dead letters would come back to ``name`` (a → b → a):
        an item would move between the queues at every dequeue of either, never
        delivered, each move written and fsynced."""
        path = [name]
        hop_config = config
        while hop_config.max_deliveries is not None:  # only then does a queue move items
            target = effective_dead_letter_queue(path[-1], hop_config)
            if target == name:
                circle = " -> ".join([*path, name])
                raise ConfigConflict(
                    f"dead letters would go round in a circle: {circle}", queue=name
                )
            q = self._queues.get(target) if target is not None else None
            if q is None or target in path:
                return
            path.append(q.name)
            hop_config = q.config

    def delete_queue(self, name: str, *, force: bool = False) -> None:
        """Delete ``name`` and all its items. While other queues name it as their
        dead-letter queue it is refused (``DeadLetterQueueInUse``) unless ``force``:
        the dead letters it holds would go, and the next one would start it anew. Every
        front end calls this; each delete is logged (a forced one as a warning)."""
        self._check_writable()
        with self._lock:
            self._queue(name)
            sources = self.dead_letter_sources(name)
            if sources and not force:
                named = ", ".join(sources)
                raise DeadLetterQueueInUse(
                    f"queue {name} is the dead-letter queue of {named}: its dead letters "
                    f"would be lost and the next would create it again; give {named} "
                    "another dead_letter_queue first, or delete it with force"
                )
            lsn = self._ship_control(name, "delete_queue")
            sink = self.replication
            self._delete(name)
        self._await_commit(lsn, sink)
        if sources:
            log.warning(
                "queue %s deleted, though it is the dead-letter queue of %s (their next "
                "dead letters create it anew)",
                name,
                ", ".join(sources),
            )
        else:
            log.info("queue %s deleted", name)

    def dead_letter_sources(self, name: str) -> list[str]:
        """The queues whose dead letters go to ``name`` (by their config), by name."""
        with self._lock:
            return sorted(
                q.name
                for q in self._queues.values()
                if q.name != name and effective_dead_letter_queue(q.name, q.config) == name
            )

    def _delete(self, name: str) -> None:
        with self._lock:
            q = self._queue(name)
            del self._queues[name]
        q.close()
        trash = os.path.join(self.root, "queues", f".deleted-{name}-{time.time_ns()}")
        fileio.rename(q.directory, trash)
        fileio.fsync_dir(os.path.join(self.root, "queues"))
        shutil.rmtree(trash, ignore_errors=True)
        self.moved.forget_queue(name)
        self._forget_schedules(name)
        self.emit("queue_deleted", name, [])

    def stats(self, name: str) -> QueueStats:
        q = self._queue(name)
        return self.operator_stats(q, q.stats())

    def totals(self, name: str) -> tuple[int, int, int]:
        """Items enqueued, released, and whose lease expired, in ``name`` since the
        server started: counted by the queue as it writes (no callback per write), for
        readers that take rates from differences (the telemetry ring)."""
        q = self._queue(name)
        rates = q.rates
        return rates.total("enqueue"), rates.total("release"), q.lease_expired

    # ------------------------------------------------------------------ validation

    def _check_batch(self, n: int) -> None:
        if n > self.config.max_batch:
            check_batch(n, self.config.max_batch)  # raises, in the rule's words

    def _prepare(
        self, items: Sequence[NewItem], now: int
    ) -> tuple[
        list[tuple[int, bytes]],
        list[str | None] | None,
        list[bool] | None,
        list[str | None] | None,
    ]:
        """The batch's (deadline, value) pairs, its idempotency keys (None when no item
        has one), which keyed items replace a pending item of their key (None: none
        does) and each item's group (None when no item has one), all validated: the
        size of the batch, then each item's value and deadline in order, then the
        keys, then the groups — so bad input is refused before anything is written,
        and the first error found is the same whichever way the batch is sent.
        (``on_duplicate`` says what a repeated key does: an item without a key has
        none to repeat, and its ``on_duplicate`` changes nothing.) An item with
        neither key nor group costs no call beyond the pass over the batch."""
        config = self.config
        if len(items) > config.max_batch:
            check_batch(len(items), config.max_batch)  # raises, in the rule's words
        limit = config.max_value_bytes
        # an item without deadline or delay is due now: ``resolve_deadline``'s answer,
        # without a call per item when the clock reads a valid deadline
        now_ok = type(now) is int and 0 <= now <= MAX_DEADLINE
        out: list[tuple[int, bytes]] = []
        append = out.append
        keyed = grouped = False
        for i, item in enumerate(items):
            value = item.value
            if not isinstance(value, bytes | bytearray | memoryview):
                raise InvalidArgument("value must be bytes", index=i)
            if len(value) > limit:
                raise ValueTooLarge(
                    f"value is {len(value)} bytes; the limit is {limit}", index=i, limit=limit
                )
            deadline, delay_ms = item.deadline, item.delay_ms
            if deadline is None and delay_ms is None and now_ok:
                append((now, bytes(value)))
            else:
                append((resolve_deadline(deadline, delay_ms, now), bytes(value)))
            if not keyed and getattr(item, "key", None) is not None:
                keyed = True
            if not grouped and getattr(item, "group", None) is not None:
                grouped = True
        if not keyed:
            return out, None, None, _groups(items) if grouped else None
        replace: list[bool] | None = None
        for n, item in enumerate(items):
            if item.key is not None:
                check_key(item.key, n)
                how = getattr(item, "on_duplicate", "keep")
                if how != "keep":
                    if how not in ON_DUPLICATE:
                        raise BrokenRule(
                            f"items.{n}: on_duplicate must be 'keep' or 'replace'",
                            "on_duplicate",
                        )
                    if replace is None:
                        replace = [False] * len(items)
                    replace[n] = True
        return out, [i.key for i in items], replace, _groups(items) if grouped else None

    # ------------------------------------------------------------------ operations

    def enqueue_nowait(
        self,
        name: str,
        items: Sequence[NewItem],
        inline: InlineCommits | None = None,
        *,
        meta: bytes = b"",
    ) -> Future[list[Enqueued]]:
        """Enqueue a batch; never blocks. The future resolves when the batch is durable.
        ``inline``: the calling thread's own group commits (``Syncer.commit_inline``;
        the server's event loop), which then make the batch durable instead of the
        syncer thread; as every ``inline`` argument, only from the thread that made it.
        ``meta``: item metadata entries the batch's log record also carries (a
        schedule's progress, ``storage/schedules.py``)."""
        now = self.now()
        prepared, keys, replace, groups = self._prepare(items, now)
        if not prepared:
            return resolved([])
        q = self._queues.get(name) if self.plainly_writable else None
        if q is None:  # a refusal (a follower, a leader that must ask), or a new queue
            q = self._queue_for_write(name)
        return q.enqueue(
            prepared,
            keys=keys,
            now=now,
            extra_meta=meta,
            groups=groups,
            inline=inline,
            replace=replace,
        )

    def enqueue(
        self, name: str, items: Sequence[NewItem], timeout: float | None = None
    ) -> list[Enqueued]:
        """Enqueue a batch and wait until it is durable (waits out write stalls)."""
        timeout = self.config.wait_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self.enqueue_nowait(name, items).result(timeout)
            except WriteStall:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.005)

    def dequeue(self, name: str, count: int = 1, lease_ms: int | None = None) -> list[Delivery]:
        limit = self.config.max_batch
        if type(count) is not int or not 1 <= count <= limit:
            count_range(limit).check(count)  # raises, in the rule's words
        if not self.plainly_writable:
            self._check_writable()
        q = self._queues.get(name)
        return (q if q is not None else self._queue(name)).dequeue(count, lease_ms)

    def release_nowait(
        self, name: str, items: Sequence[Release], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        if len(items) > self.config.max_batch:
            self._check_batch(len(items))
        if not self.plainly_writable:
            self._check_writable()
        q = self._queues.get(name)
        return (q if q is not None else self._queue(name)).release(items, inline)

    def release(self, name: str, items: Sequence[Release]) -> list[ItemOutcome]:
        return self.release_nowait(name, items).result(self.config.wait_timeout_s)

    def requeue_nowait(
        self, name: str, items: Sequence[Requeue], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        self._check_batch(len(items))
        self._check_writable()
        return self._queue(name).requeue(items, inline)

    def requeue(self, name: str, items: Sequence[Requeue]) -> list[ItemOutcome]:
        return self.requeue_nowait(name, items).result(self.config.wait_timeout_s)

    def fail_nowait(
        self, name: str, items: Sequence[Fail], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        """Hand leased items back under the queue's retry policy, each keeping its error
        (every error checked before anything is done: ``reasons.check_error``)."""
        self._check_batch(len(items))
        for i, f in enumerate(items):
            check_error(f.error, i)
        self._check_writable()
        return self._queue(name).fail(items, inline)

    def fail(self, name: str, items: Sequence[Fail]) -> list[ItemOutcome]:
        return self.fail_nowait(name, items).result(self.config.wait_timeout_s)

    def extend(self, name: str, items: Sequence[Extend]) -> list[ItemOutcome]:
        self._check_batch(len(items))
        self._check_writable()
        return self._queue(name).extend(items)

    def expire_leases(self, name: str | None = None) -> int:
        queues = [self._queue(name)] if name is not None else list(self._queues.values())
        return sum(q.expire_leases() for q in queues)

    def next_wakeup(self, name: str) -> int | None:
        return self._queue(name).next_wakeup()

    def watch(self, name: str, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` (from any thread, under the queue lock: keep it tiny and
        never call back into the engine) whenever pending entries are published."""
        q = self._queue(name)
        q.watchers.append(callback)
        return _remover(q.watchers, callback)

    def on_event(
        self, callback: Callable[[Event], None], *, wanted: Callable[[], bool] | None = None
    ) -> Callable[[], None]:
        """Subscribe to engine events (enqueued, released, lease_expired, ...).

        ``wanted``: asked before each event; while it answers False the callback is
        skipped (a publisher with no subscribers), and an event nobody wants is never
        built — an ``Event`` per write costs the writer's thread several µs."""
        entry = (callback, wanted)
        self._listeners.append(entry)
        return _remover(self._listeners, entry)

    def emit(self, kind: str, queue: str, ids: Sequence[int]) -> None:
        """Tell listeners; ``ids`` may be any sequence (a ``range`` for a batch)."""
        if not self._listeners:
            return
        event = None
        for cb, wanted in list(self._listeners):
            try:
                if wanted is not None and not wanted():
                    continue
                if event is None:
                    event = Event(kind, queue, tuple(ids), self.now())
                cb(event)
            except Exception:
                log.exception("event listener failed")

    # ------------------------------------------------------------------ maintenance

    def queue(self, name: str) -> Queue:
        """The queue object itself: for tools, tests and benchmarks (freeze, merge)."""
        return self._queue(name)

    def freeze(self, name: str) -> None:
        """Freeze the queue's current log now and wait until its segment file is in."""
        q = self._queue(name)
        q.freeze_now()
        self.compactor.wait_idle(timeout=120)

    def merge_policy_hook(self, source: MergeSource) -> None:
        if self.config.auto_merge and not self.closed:
            self.merge_policy.consider(source)

    def _retry_dead_letter(
        self,
        source: Queue,
        entries: list[DeadEntry],
        target: str,
        error: StorageError,
        reasons: dict[int, tuple[Reason, ...]] | None = None,
    ) -> None:
        """The move was refused (a write stall, a replica group that acknowledges
        nothing): the items are no longer leased nor ahead of the cursor, so only a
        retry brings them anywhere. Retried every second while this node takes writes
        (a follower gets the leader's copy instead); until then they stay at the source
        on disk and a restart delivers them."""
        log.warning(
            "queue %s: cannot dead-letter %d item(s) to %s yet (%s); retrying in 1 s",
            source.name,
            len(entries),
            target,
            error,
        )
        if self.closed or source.closed or not self.writable:
            return

        def again() -> None:
            if not self.closed and self.writable:
                self.dead_letter(source, entries, reasons)

        source.call_later(1.0, again)

    def dead_letter(
        self,
        source: Queue,
        entries: list[DeadEntry],
        reasons: dict[int, tuple[Reason, ...]] | None = None,
    ) -> None:
        """Move entries to ``source``'s dead-letter queue, then cancel them at the source.

        The dead-letter copy is made durable first, so a crash in between leaves the
        item in both queues (delivered at least once), never in neither. The item keeps
        its group there (``docs/delivery.md``).
        """
        target_name = effective_dead_letter_queue(source.name, source.config)
        assert target_name is not None
        now = self.now()
        try:
            target = self._queue_for_write(target_name)
        except StorageError as exc:
            self._retry_dead_letter(source, entries, target_name, exc, reasons)
            return
        for i, (key, stats, value, group) in enumerate(entries):
            enq, _req, cnt = decode_stats(stats)
            try:
                why = reasons.get(key_id(key)) if reasons else None
                fut = target.enqueue(
                    [(now, value)],
                    stats=(enq, now, cnt),
                    origin=source.name,
                    groups=None if group is None else [intern_group(group)],
                    reasons=None if why is None else [why],
                )
            except StorageError as exc:  # a passing refusal (a stall): try again shortly
                self._retry_dead_letter(source, entries[i:], target_name, exc, reasons)
                return

            def moved(f: Future[Any], key: bytes = key) -> None:
                if f.exception() is None:
                    self.moved.record(source.name, key_id(key), target_name, f.result()[0].id)
                if f.exception() is None and not source.closed:
                    try:
                        source.tombstone_keys([key])
                    except StorageError:
                        log.exception("queue %s: dead-letter tombstone failed", source.name)

            fut.add_done_callback(moved)
        with source.lock:
            source.dead_lettered += len(entries)
        log.info(
            "queue %s: %d item(s) delivered %d times moved to dead-letter queue %s: ids %s",
            source.name,
            len(entries),
            source.config.max_deliveries,
            target_name,
            [key_id(e[0]) for e in entries][:20],
        )
        self.emit(
            "dead_lettered",
            source.name,
            [key_id(e[0]) for e in entries],
        )


def _groups(items: Sequence[NewItem]) -> list[str | None] | None:
    """Each item's group, checked (``InvalidGroup`` naming the first bad one), or None
    when no item of the batch has one (the common case costs one pass)."""
    groups: list[str | None] | None = None
    for i, item in enumerate(items):
        group = getattr(item, "group", None)
        if group is not None:
            if groups is None:
                groups = [None] * len(items)
            groups[i] = check_group(group, i)
    return groups


def _holds_data(path: str) -> bool:
    """True for a directory holding anything but half-written files (``*.tmp``): what
    an interrupted queue creation leaves is an empty directory or a ``*.tmp``."""
    try:
        return any(not n.endswith(".tmp") for n in os.listdir(path))
    except NotADirectoryError:
        return False
