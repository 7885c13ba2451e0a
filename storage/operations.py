"""What an operator asks of a queue: pause and resume, browse and peek, purge, delete
one item, redrive dead letters, and the figures stats adds for them.

A mixin of ``Engine`` (``storage/engine.py``) so the engine module stays about
routing and validation. Every state change is durable before it is answered:

- pause/resume rewrite the queue's ``state.json`` (``storage/queue_state.py``);
- purge, delete and redrive write tombstones through the queue's log, like a release.
  Tombstones for items *ahead of* the dequeue cursor are kept in the in-memory
  segment (the view must see them to skip the item) and, while their record is on its
  way to disk, the first such key is a barrier dequeue does not pass — so no consumer
  can lease an item whose removal is in flight. Leased items lose their lease (their
  receipts become stale) and get an ordinary tombstone.
- redrive makes each item durable in its target queue first, then tombstones it in
  the dead-letter queue: a crash in between leaves it in both, never in neither.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from dq.storage.backup import BackupResult, backup
from dq.storage.browse import (
    BROWSE_STATES,
    as_item,
    browse,
    decode_cursor,
    gone,
    net_at,
    resolve,
    scan_candidates,
    tombstone_key,
    waiting_keys,
)
from dq.storage.codec import decode_stats, encode_key, encode_stats, key_id
from dq.storage.errors import (
    InvalidArgument,
    ItemNotFound,
    NotADeadLetterQueue,
    ReplicationStalled,
    ReplicationTimeout,
    StorageError,
    WriteStall,
)
from dq.storage.moved import MovedItems
from dq.storage.queue_state import QueueState
from dq.storage.reasons import Reason
from dq.storage.types import (
    BrowsedItem,
    BrowsePage,
    GroupFigures,
    ItemOutcome,
    QueueConfig,
    QueueStats,
    RedriveResult,
    check_queue_name,
    default_dead_letter_queue,
)

if TYPE_CHECKING:
    from dq.storage.config import EngineConfig
    from dq.storage.queue import Queue
    from dq.storage.replication import ReplicationSink

__all__ = ["MAX_BROWSE", "MAX_DEDUP_WINDOW_MS", "Operations", "effective_dead_letter_queue"]

log = logging.getLogger(__name__)

#: items in one browse page, at most
MAX_BROWSE = 1000
#: longest idempotency window a queue may have (memory grows with keys in the window)
MAX_DEDUP_WINDOW_MS = 7 * 24 * 3600 * 1000
#: tombstones per log record when purging or redriving a large queue
_CHUNK = 5000


def effective_dead_letter_queue(name: str, config: QueueConfig) -> str | None:
    """The queue dead letters of ``name`` actually go to (``<name>.dlq`` by default)."""
    if config.dead_letter_queue is not None:
        return config.dead_letter_queue
    if config.max_deliveries is not None:
        return default_dead_letter_queue(name)
    return None


#: how many times a lookup by id reads the segment files again when a freeze or a
#: merge swapped them while it read (then it answers from what it found)
_SCANS = 5


@contextmanager
def _scanned(q: Queue, item_id: int) -> Iterator[set[bytes]]:
    """The keys item ``item_id`` may have in the segment files, yielded with the queue
    lock held and the segment files still the ones that were read.

    The files are read outside the lock (``scan_candidates``). A merge or a freeze
    installed meanwhile moves the item into a file that was not read (the inputs are
    deleted, a frozen log leaves memory): resolving what was found would answer that an
    item which is there is gone. So the files are read again until none changed."""
    for attempt in range(_SCANS):
        with q.lock:
            files = [r.path for r in q.files.segments]
        candidates, _unreadable = scan_candidates(q, item_id)
        q.lock.acquire()
        if [r.path for r in q.files.segments] == files or attempt == _SCANS - 1:
            break
        q.lock.release()
    try:
        yield candidates
    finally:
        q.lock.release()


def _check_id(q: Queue, item_id: object) -> int:
    if not isinstance(item_id, int) or isinstance(item_id, bool) or item_id <= 0:
        raise ItemNotFound(f"item ids are positive integers, not {item_id!r}", queue=q.name)
    if item_id >= q.next_id:
        raise ItemNotFound(
            f"no item {item_id} was ever enqueued in queue {q.name!r} "
            f"(its ids so far are below {q.next_id})",
            queue=q.name,
            id=item_id,
        )
    return item_id


class Operations:
    """Operator calls of ``Engine``; see the module docstring."""

    if TYPE_CHECKING:
        config: EngineConfig
        now: Callable[[], int]
        _queues: dict[str, Queue]
        replication: ReplicationSink | None
        moved: MovedItems

        root: str

        def _queue(self, name: str) -> Queue: ...
        def queue(self, name: str) -> Queue: ...
        def list_queues(self) -> list[str]: ...
        def _queue_for_write(self, name: str) -> Queue: ...
        def _check_writable(self) -> None: ...
        def _ship_control(self, name: str, op: str, **fields: Any) -> int: ...
        def _await_commit(self, lsn: int, sink: ReplicationSink | None) -> None: ...
        def stats(self, name: str) -> QueueStats: ...

    # ------------------------------------------------------------------ pause

    def pause(self, name: str) -> QueueStats:
        """Stop handing out items (durably); enqueue, release, requeue, extend go on."""
        self._check_writable()
        q = self._queue(name)
        lsn = 0
        with q.lock:
            q.check_open()
            if not q.state.paused:
                state = QueueState(paused_since=self.now())
                q.set_state(state)
                lsn = self._ship_control(name, "paused", paused=True, since=state.paused_since)
                log.info("queue %s paused", name)
            sink = self.replication
        self._await_commit(lsn, sink)
        return self.stats(name)

    def resume(self, name: str) -> QueueStats:
        """Hand out items again; long-polls waiting on the queue wake at once."""
        self._check_writable()
        q = self._queue(name)
        lsn = 0
        with q.lock:
            q.check_open()
            if q.state.paused:
                q.set_state(QueueState())
                lsn = self._ship_control(name, "paused", paused=False)
                log.info("queue %s resumed", name)
                q.notify()
            sink = self.replication
        self._await_commit(lsn, sink)
        return self.stats(name)

    # ------------------------------------------------------------------ reading

    def browse(
        self,
        name: str,
        state: str = "all",
        after: str | None = None,
        limit: int = 100,
        with_values: bool = False,
    ) -> BrowsePage:
        """A page of items in (deadline, id) order without leasing them."""
        q = self._queue(name)
        if state not in BROWSE_STATES:
            raise InvalidArgument(
                f"state must be one of {', '.join(BROWSE_STATES)}, not {state!r}", state=state
            )
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BROWSE:
            raise InvalidArgument(f"limit must be between 1 and {MAX_BROWSE}", limit=limit)
        start = decode_cursor(name, after) if after else b""
        now = self.now()
        with q.lock:
            q.check_open()
            q.requeue_expired(now)
            return browse(q, state, start, limit, with_values, now)

    def peek(self, name: str, item_id: int, with_values: bool = True) -> BrowsedItem:
        """Item ``item_id`` wherever it is (state "gone" if it no longer exists).

        A failed or quarantined queue answers its error, as browse does: what it holds
        in memory then is not what is on disk, and "gone" (or "never assigned") would
        tell an operator that an item waiting on disk was released."""
        q = self._queue(name)
        now = self.now()
        with q.lock:
            q.check_open()
            _check_id(q, item_id)
            q.requeue_expired(now)
            found = resolve(q, item_id, set())  # leases and in-memory segments first
            if found is not None:
                return as_item(q, found, now, with_values)
        with _scanned(q, item_id) as candidates:
            found = resolve(q, item_id, candidates)
            if found is None:
                return gone(q, item_id, self.moved.lookup(name, item_id))
            return as_item(q, found, now, with_values)

    def groups(self, name: str, limit: int = 20) -> list[GroupFigures]:
        """The queue's busiest groups now: those with the most leased and held items
        (``docs/delivery.md``; groups whose items all wait ahead of the cursor have
        nothing leased or held, and are not listed)."""
        q = self._queue(name)
        if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_BROWSE:
            raise InvalidArgument(f"limit must be between 1 and {MAX_BROWSE}", limit=limit)
        now = self.now()
        with q.lock:
            q.check_open()
            q.requeue_expired(now)
            return [GroupFigures(*row) for row in q.deliveries.index.busiest(limit, now)]

    # ------------------------------------------------------------------ removing

    def delete_item(self, name: str, item_id: int) -> None:
        """Remove one item without a receipt (a leased one too: its receipt goes stale)."""
        self._check_writable()
        q = self._queue(name)
        with q.lock:
            _check_id(q, item_id)
        with _scanned(q, item_id) as candidates:
            q.check_open()
            q.requeue_expired(self.now())
            found = resolve(q, item_id, candidates)
            if found is None:
                raise ItemNotFound(
                    f"item {item_id} is no longer in queue {name!r} "
                    "(released, deleted, purged or dead-lettered)",
                    queue=name,
                    id=item_id,
                )
            if found.lease is not None:
                fut = q.cancel_leased([item_id])
            else:
                fut = q.cancel_ahead([found.key])
        fut.result()
        log.info("queue %s: item %d deleted", name, item_id)

    def purge(self, name: str) -> int:
        """Remove every item, leased ones included; returns how many were removed."""
        self._check_writable()
        q = self._queue(name)
        removed = 0
        with q.lock:
            q.check_open()
            q.requeue_expired(self.now())
            leased = [item_id for item_id, _lease in q.deliveries.leases.values()]
            futures = [q.cancel_leased(leased)] if leased else []
            removed += len(leased)
        after = b""
        while True:
            with q.lock:
                q.check_open()
                if q.jobs.stalled():
                    stalled = True
                    q.jobs.retry_rotation()  # as a stalled enqueue does: nothing else may
                else:
                    stalled = False
                    found = waiting_keys(q, after, _CHUNK)
                    if not found:
                        break
                    keys = [k for k, _ in found]
                    try:
                        futures.append(q.cancel_ahead(keys))
                    except ReplicationStalled as exc:
                        if not futures:
                            raise  # nothing written: a plain refusal
                        raise ReplicationTimeout(
                            "the replica group stalled part way through the purge: some "
                            "items are removed, the rest are not; its outcome is unknown",
                            queue=name,
                        ) from exc
                    after = tombstone_key(keys[-1])
                    removed += len(keys)
            if stalled:
                time.sleep(0.01)  # segment files are behind: let the freeze catch up
                continue
            futures[-1].result()
        for f in futures:
            f.result()
        log.info("queue %s purged: %d items removed", name, removed)
        return removed

    # ------------------------------------------------------------------ redrive

    def _dead_letter_sources(self, dlq: str) -> list[str]:
        return sorted(
            n for n, q in list(self._queues.items())
            if effective_dead_letter_queue(n, q.config) == dlq
        )  # fmt: skip

    def redrive(
        self,
        dlq: str,
        to: str | None = None,
        ids: Sequence[int] | None = None,
        limit: int | None = None,
    ) -> RedriveResult:
        """Move dead letters back to the queue they died in (or ``to``), due now, with
        their delivery count reset and their enqueue time kept. Per item all or nothing."""
        self._check_writable()
        src = self._queue(dlq)
        if to is not None:
            check_queue_name(to)
            if to == dlq:
                raise InvalidArgument("'to' must name another queue than the one redriven")
        sources = self._dead_letter_sources(dlq)
        if to is None and not sources and not src.meta.origins:
            raise NotADeadLetterQueue(
                f"queue {dlq!r} is no queue's dead-letter queue and its items name no "
                "queue they came from: say where they go with 'to'",
                queue=dlq,
            )
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise InvalidArgument("limit must be a positive integer", limit=limit)
        fallback = sources[0] if len(sources) == 1 else None
        failed: list[ItemOutcome] = []
        moved = 0
        targets: set[str] = set()
        if ids is not None:
            if not isinstance(ids, list | tuple) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise InvalidArgument("ids must be a list of item ids")
            if len(ids) > self.config.max_batch:
                raise InvalidArgument(f"at most {self.config.max_batch} ids per redrive")
            wanted = list(dict.fromkeys(ids))[:limit] if limit else list(dict.fromkeys(ids))
            scans = {i: scan_candidates(src, i)[0] for i in wanted if 0 < i < src.next_id}
            with src.lock:
                src.check_open()
                src.requeue_expired(self.now())
                chosen: list[tuple[int, bytes, tuple[bytes, bytes]]] = []
                for i in wanted:
                    found = resolve(src, i, scans[i]) if i in scans else None
                    if found is None:
                        failed.append(
                            ItemOutcome(i, "item_not_found", f"no item {i} in queue {dlq!r}")
                        )
                    elif found.lease is not None:
                        failed.append(
                            ItemOutcome(
                                i, "item_leased", f"item {i} is leased: release it or retry later"
                            )
                        )
                    else:
                        s = found.stats
                        raw = (s.enqueue_time, s.requeue_time, s.dequeue_count)
                        chosen.append((i, found.key, (encode_stats(*raw), found.value or b"")))
                batch = self._redrive_hold(src, chosen)
            n, t = self._redrive_move(src, batch, to, fallback, failed)
            return RedriveResult(n, sorted(t), failed)
        after = b""
        left = limit
        while left is None or left > 0:
            with src.lock:
                src.check_open()
                want = _CHUNK if left is None else min(_CHUNK, left)
                found_keys = waiting_keys(src, after, want)
                if not found_keys:
                    break
                after = tombstone_key(found_keys[-1][0])
                chosen = [(key_id(k), k, entry) for k, entry in found_keys]
                batch = self._redrive_hold(src, chosen)
            n, t = self._redrive_move(src, batch, to, fallback, failed)
            moved += n
            targets |= t
            if left is not None:
                left -= len(chosen)
        return RedriveResult(moved, sorted(targets), failed)

    @staticmethod
    def _redrive_hold(
        src: Queue, chosen: list[tuple[int, bytes, tuple[bytes, bytes]]]
    ) -> tuple[int | None, list[tuple[int, bytes, tuple[bytes, bytes]]]]:
        """Bar dequeue from passing the first chosen item until the move is written."""
        if not chosen:
            return None, chosen
        return src.hold(min(k for _, k, _ in chosen)), chosen

    def _redrive_move(
        self,
        src: Queue,
        held: tuple[int | None, list[tuple[int, bytes, tuple[bytes, bytes]]]],
        to: str | None,
        fallback: str | None,
        failed: list[ItemOutcome],
    ) -> tuple[int, set[str]]:
        token, chosen = held
        now = self.now()
        pending: list[tuple[int, bytes, str, Future[Any]]] = []
        tombs: Future[Any] | None = None
        try:
            for item_id, key, (stats, value) in chosen:
                target = to or src.meta.origins.get(item_id) or fallback
                if target is None or target == src.name:
                    failed.append(
                        ItemOutcome(
                            item_id,
                            "unknown_origin",
                            f"item {item_id} names no queue it came from: redrive it with 'to'",
                        )
                    )
                    continue
                enq, _req, _cnt = decode_stats(stats)
                with src.lock:  # where the entry lives may change under a merge; its
                    # attempts start afresh, its reasons go with it
                    group = src.files.group_of(key, None)
                    why = src.item_reasons(item_id)
                try:
                    tq = self._queue_for_write(target)
                    fut = _enqueue_waiting(tq, value, (enq, now, 0), group, why)
                except StorageError as exc:
                    failed.append(ItemOutcome(item_id, exc.code, exc.message))
                    continue
                pending.append((item_id, key, target, fut))
            done: list[bytes] = []
            targets: set[str] = set()
            for item_id, key, target, fut in pending:
                try:
                    copy = fut.result()[0]
                except StorageError as exc:
                    failed.append(ItemOutcome(item_id, exc.code, exc.message))
                    continue
                self.moved.record(src.name, item_id, target, copy.id)
                done.append(key)
                targets.add(target)
            with src.lock:
                if token is not None:
                    src.unhold(token)
                    token = None
                try:
                    tombs = src.cancel_ahead(done) if done else None
                except ReplicationStalled as exc:  # the copies are written: no refusal
                    raise ReplicationTimeout(
                        f"{len(done)} item(s) were copied to {sorted(targets)} but the replica "
                        "group stalled before their removal here: they may be in both queues",
                        queue=src.name,
                    ) from exc
        finally:
            if token is not None:
                with src.lock:
                    src.unhold(token)
        if tombs is not None:
            tombs.result()
        if done:
            log.info("queue %s: %d items redriven to %s", src.name, len(done), sorted(targets))
        return len(done), targets

    # ------------------------------------------------------------------ backup

    def backup(self, dest: str) -> BackupResult:
        """A consistent copy of the data directory at ``dest`` (``storage/backup.py``)."""
        return backup(self, dest)

    # ------------------------------------------------------------------ upkeep

    def forget_expired_keys(self, q: Queue) -> None:
        """Drop idempotency keys past their window from memory, the reasons of a few
        items that are gone (``forget_gone_reasons``), and (once a minute) delete metadata
        sidecars that hold nothing but expired keys."""
        now = self.now()
        window = q.config.dedup_window_ms
        if q.meta.errors.notes:
            self.forget_gone_reasons(q)
        with q.lock:
            if q.closed:
                return
            q.meta.prune(now, window)
            due = now - q.meta.sidecars_checked >= 60_000
            if due:
                q.meta.sidecars_checked = now
                in_use = q.meta.errors.logs_in_use()
        if due:
            q.meta.prune_sidecars(q.directory, now, window, in_use)

    def forget_gone_reasons(self, q: Queue) -> int:
        """Forget the reasons of a few items that are gone (released, deleted, moved),
        round robin over the items with reasons (``ItemErrors.next_to_check``); the
        number forgotten.

        An item is gone when the entry its note names is behind the dequeue cursor and
        neither leased nor held back by the delivery rules (released), or ahead of it
        and cancelled (deleted, purged, redriven, or released before a restart: one
        block per segment file holding its key). An entry of a write in flight (at or
        past the barrier) is left for a later round."""
        with q.lock:
            if q.closed or q.failed is not None or not q.health.loaded:
                return 0
            errors = q.meta.errors
            cursor = q.deliveries.cursor
            barrier = q.commit.barrier()
            index = q.deliveries.index
            gone = 0
            for item_id in errors.next_to_check():
                note = errors.notes[item_id]
                pkey = encode_key(note.deadline, item_id)
                if q.deliveries.leases.get(item_id) is not None:
                    continue
                if barrier is not None and pkey >= barrier:
                    continue
                if (
                    pkey <= cursor
                    and index.indexed
                    and index.holds(pkey, q.files.group_of(pkey, None))
                ):
                    continue  # held back by the delivery rules: waiting, not gone
                if pkey <= cursor or net_at(q, pkey) <= 0:
                    errors.forget(item_id)
                    gone += 1
            return gone

    # ------------------------------------------------------------------ stats

    def operator_stats(self, q: Queue, s: QueueStats) -> QueueStats:
        now = self.now()
        with q.lock:
            since = q.deliveries.leases.oldest_since()
            rates = q.rates
            return dataclasses.replace(
                s,
                paused=q.state.paused,
                paused_since=q.state.paused_since,
                dead_lettered=q.dead_lettered,
                lease_expired=q.lease_expired,
                oldest_lease_age_ms=None if since is None else max(0, now - since),
                enqueue_per_s=rates.per_second("enqueue", now),
                dequeue_per_s=rates.per_second("dequeue", now),
                release_per_s=rates.per_second("release", now),
                dead_letter_queue=effective_dead_letter_queue(q.name, q.config),
            )


def _enqueue_waiting(
    q: Queue,
    value: bytes,
    stats: tuple[int, int, int],
    group: str | None = None,
    reasons: tuple[Reason, ...] | None = None,
) -> Future[Any]:
    """``Queue.enqueue`` of one item due now (keeping its group and its reasons),
    waiting out a short write stall."""
    give_up = time.monotonic() + 30
    groups = None if group is None else [group]
    why = None if reasons is None else [reasons]
    while True:
        try:
            return q.enqueue([(q.engine.now(), value)], stats=stats, groups=groups, reasons=why)
        except WriteStall:
            if time.monotonic() > give_up:
                raise
            time.sleep(0.005)
