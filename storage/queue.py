"""One queue, as the parts it holds and the class that composes them.

The invariant the queue keeps: every pending entry whose key is at or below the cursor
(the last key dequeue passed) is either leased, held back by the delivery rules (the
delivery index, ``storage/_delivery.c``: its key is in its group's FIFO there), or
cancelled by a tombstone that has been (or is being) written. So dequeue never looks
behind the cursor but through the index, and any new entry is placed strictly after it
(its deadline advanced if needed; docs/storage.md: "deadline can never be before the
oldest dequeued item"). Whatever reads below the cursor — browse, peek, delete, purge,
redrive, stats — asks the index which entries there it holds.

Write path (``docs/architecture.md``, "One enqueue"): ``enqueue`` validates nothing
(the engine did), takes the lock, gives the items ids and keys after the cursor and
frames one log record for the batch (``_write_pending``) → ``_submit`` appends it to
the log (``GroupCommit.append``, a memory buffer) and, with ``always``, hands the queue
to a sync round: the calling thread's own if it passed them (``inline``, the server's
event loop: ``storage/syncer.py``), else the syncer thread's → the round
(``sync_round``) writes and fsyncs the buffer (``GroupCommit.write_round``) → only
then are the batches it covered published into the in-memory segment (``_publish``)
and their futures resolved. Until published, a
batch's smallest key is a barrier dequeue does not pass (``GroupCommit.hold``), so the
cursor can never overtake an entry that is not visible yet.

The parts, each owning its own state (every one guarded by the queue's ``lock``):

- ``commit``, ``GroupCommit`` (``group_commit.py``): the log writer and the id counter,
  the batches waiting to be durable, the sync round's write and fsync, the barrier of
  unpublished batches, cutting the log back after a failure;
- ``files``, ``SegmentSet`` (``segment_set.py``): the in-memory segments, the segment
  files, the merged view dequeue reads, and the state of rotations, freezes and merges;
- ``deliveries``, ``Deliveries`` (``deliveries.py``): the cursor, the leases and the
  delivery index (slots, held items: ``_delivery.c``), and dequeue's walk of the view;
- ``health``, ``Health`` (``health.py``): whether the queue takes work (loaded, failed
  after an I/O error, damaged, closed) and when it next tries to reopen;
- ``timers``, ``Timers`` (``timers.py``): calls later (a failed freeze tried again, a
  dead letter moved again), none of which runs once the queue closed;
- beside them the operator's state (``queue_state.py``, ``state.json``), item metadata
  (``itemmeta.py``: idempotency keys, dead-letter origins, items' reasons; ``dedup.py``
  sorts a keyed batch; ``item_notes.py`` says what a moved item carries and where a
  retry policy puts a failed one), rates (``rates.py``), due/delayed counts
  (``state_counts.py``), the config (``queue_config.py``, ``queue.json``).

What spans parts is given the parts it coordinates (and never calls the queue):

- ``failing``, ``Failing`` (``failing.py``): a refused batch rolled back, and the queue
  failed after a write or sync error (every waiting batch refused, the log cut back);
- ``jobs``, ``FileJobs`` (``file_jobs.py``): rotating the log, freezing closed logs,
  merging segment files: when each runs, installing what the compaction worker wrote,
  trying again what failed.
- ``frames``, ``MoveFrames`` (``move_frames.py``): the records that move items to new
  keys — a requeue, a fail, a lease run out, a pending item moved by its key — each
  item's new entry, the tombstone of the one it leaves, and what it carries; and the
  batch that submits a record of moves.
- ``leader``, ``ReplicaLeader`` (``replica_leader.py``): a replica group's leader's
  side — the lsn of the last record shipped, whether a write waits for the group's
  commit, the waiting writes let go when the node stops shipping to their sink, and
  the copy of the files a follower that (re)joins starts from.
- ``follower``, ``ReplicaFollower`` (``replica_follower.py``): a replica group's
  follower's side — one of the leader's records read and made the batch that appends
  it as the leader framed it, its groups kept and the id counter past its ids.

``Queue`` composes them: every public method is one operation, and the steps that are
its own are publishing a batch (``_publish``), the sync round (``sync_round``, which
also carries out a rotation with ``always``), and opening and reopening from disk
(``_load``). None of the parts runs a closure of another.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from dq.storage import fileio
from dq.storage._leases import Lease
from dq.storage.codec import (
    MAX_ID,
    PENDING_HEADER,
    TOMBSTONE,
    encode_key,
    encode_stats,
    key_deadline,
    key_id,
    tombstone_of,
)
from dq.storage.compactor import Compactor
from dq.storage.config import EngineConfig
from dq.storage.dedup import KeyedBatch, split_keyed
from dq.storage.deliveries import Deliveries
from dq.storage.errors import (
    CorruptionError,
    EngineUnavailable,
    ReplicationStalled,
    ReplicationTimeout,
    StorageError,
)
from dq.storage.failing import Failing
from dq.storage.file_jobs import FileJobs
from dq.storage.futures import Answer, answer
from dq.storage.group_commit import GroupCommit, PendingBatch
from dq.storage.health import Health
from dq.storage.item_notes import Carried, Carrying, retry_deadline
from dq.storage.itemmeta import (
    ItemMeta,
    Remembered,
    encode_group_entry,
    encode_key_entry,
    encode_origin_entry,
)
from dq.storage.key_moves import KeyState, Rekey
from dq.storage.merge_policy import MergeSource, SegmentDesc
from dq.storage.move_frames import MoveFrames, Moves
from dq.storage.prealloc import allocation_step
from dq.storage.queue_config import CONFIG_FILE, load_config, save_config
from dq.storage.queue_state import STATE_FILE, QueueState, load_state, save_state
from dq.storage.rates import Rates
from dq.storage.reasons import LEASE_EXPIRED, Reason, encode_error_entry
from dq.storage.recovery import recover_directory
from dq.storage.replica_follower import ReplicaFollower
from dq.storage.replica_leader import ReplicaLeader
from dq.storage.returning import returning_entries
from dq.storage.segment import SegmentReader
from dq.storage.segment_set import SegmentSet
from dq.storage.state_counts import StateCounter
from dq.storage.syncer import FsyncStats, InlineCommits, Syncer
from dq.storage.timers import Timers
from dq.storage.types import (
    DeadEntry,
    Delivery,
    Enqueued,
    Extend,
    Fail,
    ItemOutcome,
    QueueConfig,
    QueueStats,
    Release,
    Requeue,
)
from dq.storage.validation import MAX_LEASE_MS, check_lease_ms, resolve_deadline
from dq.storage.wal import WalWriter
from dq.storage.write_future import resolved

if TYPE_CHECKING:
    from dq.storage.replication import ReplicationSink

__all__ = ["Queue", "QueueHost"]

log = logging.getLogger("dq.storage.queue")  # one logger for a queue, whichever part logs


class QueueHost(Protocol):
    """What a queue needs from the engine that holds it (and nothing more)."""

    config: EngineConfig
    syncer: Syncer | None
    compactor: Compactor
    fsync_stats: FsyncStats
    now: Callable[[], int]
    #: a replica group leader's replicator (None: not replicating)
    replication: ReplicationSink | None
    #: the highest lsn the sync set holds (``docs/replication.md``)
    commit_lsn: int

    def emit(self, kind: str, queue: str, ids: Sequence[int]) -> None: ...

    def merge_policy_hook(self, source: MergeSource) -> None: ...

    def dead_letter(
        self,
        source: Queue,
        entries: list[DeadEntry],
        reasons: dict[int, tuple[Reason, ...]] | None = None,
    ) -> None: ...


class Queue:
    """One queue: the parts it holds, and its operations (see the module docstring)."""

    def __init__(self, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> None:
        self.engine = engine
        self.name = name
        self.directory = directory
        self.config = config
        #: guards every field here and every part's state
        self.lock = threading.RLock()
        self.commit = GroupCommit(name, engine)
        self.files = SegmentSet(name, directory)
        self.deliveries = Deliveries()
        self.deliveries.index.configure(config, engine.now())
        self.health = Health(name, directory)
        #: called whenever entries are published (``Engine.watch``)
        self.watchers: list[Callable[[], None]] = []
        #: a publication told the watchers during the current sync round (``sync_round``
        #: then does not tell them again)
        self.woke = False
        # operator features (storage/queue_state.py, itemmeta.py, rates.py, state_counts.py)
        self.state = QueueState()
        self.meta = ItemMeta()
        self.rates = Rates()
        #: counts due and delayed items for stats; remembers the oldest due deadline
        self.state_counter = StateCounter()
        self.dead_lettered = 0
        self.lease_expired = 0
        #: calls later (a failed freeze tried again), cancelled when the queue closes
        self.timers = Timers(self.lock)
        #: framing the records that move items (requeue, fail, lease expiry, by key)
        self.frames = MoveFrames(
            name, directory, self.commit, self.files, self.deliveries, self.meta
        )
        #: refusing writes: a batch rolled back, the queue failed after an I/O error
        self.failing = Failing(name, engine, self.commit, self.deliveries, self.health)
        #: a replica group's leader: the lsn shipped, writes let go, the follower's copy
        self.leader = ReplicaLeader(self.commit, self.files, self.health, self.failing)
        #: a replica group's follower: the leader's records appended as it framed them
        self.follower = ReplicaFollower(name, self.commit, self.files)
        #: rotating, freezing, merging (handed the queue only to give it to the syncer
        #: and the merge policy)
        self.jobs = FileJobs(
            name,
            directory,
            self.lock,
            engine,
            self,
            commit=self.commit,
            files=self.files,
            deliveries=self.deliveries,
            health=self.health,
            failing=self.failing,
            timers=self.timers,
            meta=self.meta,
        )

    @property
    def next_id(self) -> int:
        """The id the next item gets; every id below it was given (``GroupCommit``)."""
        return self.commit.next_id

    @property
    def closed(self) -> bool:
        """The queue was closed (``Health``)."""
        return self.health.closed

    # ------------------------------------------------------------------ opening

    @classmethod
    def create(cls, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> Queue:
        os.makedirs(directory, exist_ok=True)
        save_config(directory, config)
        q = cls(engine, name, directory, config)
        q.commit.start(WalWriter.create(directory, 1, 1, allocation_step(engine.config)))
        q.health.loaded = True
        fileio.fsync_dir(os.path.dirname(directory))
        return q

    @classmethod
    def open(cls, engine: QueueHost, name: str, directory: str) -> Queue:
        """Open a queue directory. Damage does not raise: the queue is returned
        quarantined (every operation answers ``QueueDamaged`` naming file and offset),
        so one damaged queue never keeps the others from serving."""
        settings = CONFIG_FILE
        try:
            config = load_config(directory)
            settings = STATE_FILE
            state = load_state(directory)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # name the file that could not be read (the operator rewrites or removes
            # it), and where in it the JSON broke off
            q = cls(engine, name, directory, QueueConfig())
            q.health.quarantine(
                CorruptionError(
                    f"unreadable {settings}: {exc}",
                    file=os.path.join(directory, settings),
                    offset=getattr(exc, "pos", 0),
                )
            )
            return q
        q = cls(engine, name, directory, config)
        q.state = state
        try:
            q._load()
        except CorruptionError as exc:
            q.health.quarantine(exc)
        except Exception as exc:  # a fault (disk full, descriptors): retried, like a restart
            with q.lock:
                answer(q.failing.fail(exc, "opening the queue"))
        return q

    def _load(self) -> None:
        """Read the directory into memory and start a fresh log (the restart path)."""
        rec = recover_directory(self.directory)
        try:
            meta = ItemMeta()
            meta.load_directory(
                self.directory,
                [p for p, _ in rec.frozen],
                self.engine.now(),
                self.config.dedup_window_ms,
            )
            wal = WalWriter.create(
                self.directory,
                rec.next_segment_no,
                max(rec.next_id, self.commit.next_id),
                allocation_step(self.engine.config),
            )
        except BaseException:
            for reader in rec.segments:
                reader.close()
            raise
        commit = self.commit
        commit.start(wal)
        self.files.load(rec)
        self.meta = meta
        self.jobs.meta = meta  # a freeze's install lets go of what its log's sidecar holds
        self.frames.meta = meta
        commit.next_id = max(rec.next_id, commit.next_id)  # ids of refused batches stay unused
        self.deliveries.reset()
        self.rebuild_returning()
        self.health.loaded = True
        for path, mem in list(self.files.frozen):
            self.jobs.freeze(path, mem)

    # ------------------------------------------------------------------ enqueue

    def enqueue(
        self,
        prepared: Sequence[tuple[int, bytes]],
        stats: tuple[int, int, int] | None = None,
        keys: Sequence[str | None] | None = None,
        origin: str | None = None,
        now: int | None = None,
        extra_meta: bytes = b"",
        groups: Sequence[str | None] | None = None,
        inline: InlineCommits | None = None,
        reasons: Sequence[tuple[Reason, ...] | None] | None = None,
        replace: Sequence[bool] | None = None,
    ) -> Future[list[Enqueued]]:
        """Enqueue (deadline, value) pairs, already validated. ``stats`` for dead letters
        and redrives; ``keys`` (idempotency), ``origin`` (the queue a dead letter came
        from), ``groups`` (each item's group or None, checked) and ``reasons`` (why each
        failed: a dead letter's or a redriven item's history) travel in the same log
        record as the items (``storage/itemmeta.py``), and so does ``extra_meta``
        (metadata entries of the batch: a schedule's progress); ``replace``: which keyed
        items replace the pending item of their key (``storage/dedup.py``); ``now``: the
        engine's clock as the caller read it (read here if not given); ``inline``: the
        calling thread's own group commits (``_submit``)."""
        if now is None:
            now = self.engine.now()
        # encode_stats(now, 0, 0) written out for a new item's stats
        st = encode_stats(*stats) if stats is not None else (now << 80).to_bytes(16, "big")
        with self.lock:
            health = self.health
            if health.failed is not None or health.closed:
                self.check_open()
            self.jobs.refuse_if_stalled(inline)
            window = self.config.dedup_window_ms
            if keys is not None and window > 0 and any(k is not None for k in keys):
                return self._enqueue_keyed(
                    prepared, st, keys, now, window, extra_meta, groups, inline, replace
                )
            first = self.commit.next_id
            fut = self._write_pending(
                prepared,
                st,
                now,
                extra_meta,
                origin,
                groups=groups,
                inline=inline,
                reasons=reasons,
            )
        self.engine.emit("enqueued", self.name, range(first, first + len(prepared)))
        return fut

    def _enqueue_keyed(
        self,
        prepared: Sequence[tuple[int, bytes]],
        st: bytes,
        keys: Sequence[str | None],
        now: int,
        window: int,
        extra_meta: bytes,
        groups: Sequence[str | None] | None = None,
        inline: InlineCommits | None = None,
        replace: Sequence[bool] | None = None,
    ) -> Future[list[Enqueued]]:
        """An enqueue where some items carry keys (under the lock): only the items whose
        key is new (or that have none) are written, and the pending items that items
        with "replace" repeat the keys of move (``storage/dedup.py``), all in one
        record."""
        meta = self.meta
        batch = split_keyed(meta, keys, now, window, replace, self.key_state, prepared)
        fresh = batch.fresh
        if fresh or batch.rekeys:
            first = self.commit.next_id
            picked = [batch.substitute.get(i, i) for i in fresh]  # a later "replace" wins
            for r in batch.rekeys:
                r.group = None if groups is None or r.source is None else groups[r.source]
            try:
                fut = self._write_pending(
                    [prepared[i] for i in picked],
                    st,
                    now,
                    extra_meta,
                    keyed=batch,
                    groups=None if groups is None else [groups[i] for i in picked],
                    inline=inline,
                )
            except BaseException:
                batch.refused(meta)
                raise
            batch.submitted(meta, fut)
            self.engine.emit("enqueued", self.name, range(first, first + len(fresh)))
        return batch.answer()

    def _write_pending(
        self,
        prepared: Sequence[tuple[int, bytes]],
        st: bytes,
        now: int,
        extra_meta: bytes = b"",
        origin: str | None = None,
        keyed: KeyedBatch | None = None,
        groups: Sequence[str | None] | None = None,
        inline: InlineCommits | None = None,
        reasons: Sequence[tuple[Reason, ...] | None] | None = None,
    ) -> Future[Any]:
        """Give the items ids and keys after the cursor, frame them as one log record and
        submit it (under the lock, the queue checked open and not stalled)."""
        commit = self.commit
        first = commit.next_id
        n = len(prepared)
        commit.next_id += n
        if n == 1 and keyed is None and groups is None and origin is None and reasons is None:
            # one item with nothing but its value and deadline (a single enqueue, the
            # common case): the steps below, without their lists and joins
            ((deadline, value),) = prepared
            key = ((deadline << 66) | (first << 2)).to_bytes(16, "big")  # encode_key
            if key <= self.deliveries.cursor:  # placed after the cursor
                deadline, key = self.deliveries.place(deadline, first)
            self.rates.add("enqueue", 1, now)
            batch = PendingBatch(
                self.files.memseg,
                [Enqueued(first, deadline)],
                keyed=[(key, value)],
                stats=st,
                token=commit.hold(key),
                wakes=True,
            )
            return self._submit(
                batch, PENDING_HEADER.pack(key, st, len(value)) + value, extra_meta, inline
            )
        pack = PENDING_HEADER.pack
        parts: list[bytes] = []
        pairs: list[tuple[bytes, bytes]] = []
        results: list[Enqueued] = []
        meta: list[bytes] = []
        group_meta: list[bytes] = []
        grouped: dict[bytes, str] | None = None
        cursor = self.deliveries.cursor
        item_id = first
        for deadline, value in prepared:
            key = ((deadline << 66) | (item_id << 2)).to_bytes(16, "big")  # encode_key
            if key <= cursor:  # placed after the cursor
                deadline, key = self.deliveries.place(deadline, item_id)
            parts += (pack(key, st, len(value)), value)
            pairs.append((key, value))
            results.append(Enqueued(item_id, deadline))
            if origin is not None:
                meta.append(encode_origin_entry(item_id, origin))
                self.meta.origins[item_id] = origin
            group = None if groups is None else groups[item_id - first]
            if group is not None:
                group_meta.append(encode_group_entry(item_id, group))
                if grouped is None:
                    grouped = {}
                grouped[key] = group
            item_id += 1
        self.rates.add("enqueue", n, now)
        entries: list[tuple[bytes, bytes | None, bytes | None]] | None = None
        rekeyed: list[tuple[Remembered, int, int]] = []
        carried: list[Carried] = []
        if keyed is not None:
            meta = keyed.remember(self.meta, results)
            if keyed.rekeys:
                entries = []
                grouped = {} if grouped is None else grouped
                moves = self.frames.rekeys(
                    keyed.rekeys, now, parts, entries, meta, grouped, rekeyed, carried
                )
                for r, moved in zip(keyed.rekeys, moves, strict=True):
                    assert r.index is not None
                    keyed.results[r.index] = moved
        if reasons is not None:
            log_no = self.commit.wal.segment_no
            for done, why in zip(results, reasons, strict=True):
                if why:
                    meta.append(encode_error_entry(done.id, done.deadline, why))
                    self.meta.errors.written(done.id, done.deadline, log_no, why)
        lowest = [min(pairs)[0]] if pairs else []
        if entries:
            lowest.append(min(k for k, _s, _v in entries))
        token = self.commit.hold(min(lowest))
        batch = PendingBatch(
            self.files.memseg,
            results if keyed is None else None,
            keyed=pairs,
            stats=st,
            entries=entries,
            token=token,
            remembered=None if keyed is None else keyed.new_entries,
            wakes=True,
            groups=grouped,
        )
        body, all_meta = b"".join(parts), b"".join(meta) + b"".join(group_meta) + extra_meta
        if not rekeyed:
            return self._submit(batch, body, all_meta, inline)
        return self._submit_rekeyed(batch, body, all_meta, rekeyed, carried, inline)

    # ------------------------------------------------------------------ items by key

    def key_state(self, entry: Remembered) -> KeyState:
        """Where the item ``entry`` (a key's) names is now (under the lock): leased, gone,
        or pending — its entry found in a write on its way to disk, or in the in-memory
        segments and the segment files that can hold its key (``SegmentSet.count``)."""
        pkey = encode_key(entry.deadline, entry.id)
        lease = self.deliveries.leases.get(entry.id)
        if lease is not None:
            return KeyState("leased", lease.key, lease=lease)
        flying = self.frames.in_flight(pkey)
        if flying is not None:
            return flying
        deliveries = self.deliveries
        if pkey <= deliveries.cursor:  # behind the cursor only a leased or held entry is live
            index = deliveries.index
            if not (index.indexed and index.holds(pkey, self.files.group_of(pkey, None))):
                return KeyState("gone", pkey)
        net, newest = self.files.count(pkey)
        if net > 0 and newest is not None:
            return KeyState("pending", pkey, newest[0], newest[1])
        return KeyState("gone", pkey)

    def _submit_rekeyed(
        self,
        batch: PendingBatch,
        body: bytes,
        meta: bytes,
        rekeyed: list[tuple[Remembered, int, int]],
        carried: list[Carried],
        inline: InlineCommits | None = None,
    ) -> Future[Any]:
        """Submit ``batch``, which moves the keys in ``rekeyed`` (an enqueue that
        replaces, or a move by key): if the record is refused, every key says again
        where it was and the reasons carried go back to the items they came from."""
        give_back = self._rekeyed(rekeyed, carried, batch)
        try:
            return self._submit(batch, body, meta, inline)
        except BaseException:
            give_back.give_back()
            for entry, deadline, time in rekeyed:
                entry.deadline, entry.time, entry.pending = deadline, time, None
            raise

    def _rekeyed(
        self,
        rekeyed: list[tuple[Remembered, int, int]],
        carried: list[Carried],
        batch: PendingBatch,
    ) -> Carrying:
        """Keys moved by ``batch`` wait for its publication; memory says the reasons it
        carries; the entries it leaves that the delivery rules hold back (or that are on
        their way back from a lease) leave the delivery index, put back if the record is
        refused (``batch.unheld``). Returns what gives the reasons back then."""
        left = [tomb[:15] + bytes((tomb[15] & ~TOMBSTONE,)) for tomb, st, _v in batch.entries or ()
                if st is None]  # fmt: skip
        batch.unheld = self._unhold(left)
        carrying = self.frames.note_carried(carried, batch)
        moving = [entry for entry, _d, _t in rekeyed]
        for entry in moving:
            entry.pending = batch.future
        batch.remembered = (batch.remembered or []) + moving
        return carrying

    def rekey(
        self, key: str, entry: Remembered, state: KeyState, deadline: int, value: bytes, now: int
    ) -> tuple[Future[Any], Enqueued]:
        """Move the pending item ``key`` names (``state``) to ``deadline`` with ``value``
        (call under the lock, the queue checked open and not stalled): one record, as an
        enqueue with "replace" writes it; its group stays."""
        r = Rekey(key, entry, state, deadline, value)
        r.group = self.files.group_of(state.pkey, None) or self.frames.group_in_flight(state.pkey)
        parts: list[bytes] = []
        entries: list[tuple[bytes, bytes | None, bytes | None]] = []
        meta: list[bytes] = []
        groups: dict[bytes, str] = {}
        rekeyed: list[tuple[Remembered, int, int]] = []
        carried: list[Carried] = []
        [done] = self.frames.rekeys([r], now, parts, entries, meta, groups, rekeyed, carried)
        token = self.commit.hold(min(k for k, _s, _v in entries))
        batch = PendingBatch(
            self.files.memseg, done, entries=entries, token=token, wakes=True, groups=groups or None
        )
        return self._submit_rekeyed(batch, b"".join(parts), b"".join(meta), rekeyed, carried), done

    def cancel_by_key(self, key: str, entry: Remembered, state: KeyState) -> Future[Any]:
        """Cancel the pending item ``key`` names (``state``; call under the lock, the
        queue checked open) as an operator's delete does (``cancel_ahead``: ahead of the
        cursor or held back by the delivery rules) and, in the same record, write a key
        entry that names no item (id 0), so the key is free again — after a restart too."""
        forget = encode_key_entry(0, 0, entry.time, key.encode())
        fut = self.cancel_ahead([state.pkey], entry.id, forget)
        if self.meta.keys.get(key) is entry:
            self.meta.forget_key(key)
        return fut

    # ------------------------------------------------------------------ release, requeue, fail, extend

    def release(
        self, items: Sequence[Release], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        now = self.engine.now()
        with self.lock:
            health = self.health
            if health.failed is not None or health.closed:
                self.check_open()
            taken, outcomes = self.deliveries.end(items, self.commit.next_id, now)
            if not taken:
                return resolved(outcomes)
            self.rates.add("release", len(taken), now)
            fut = self._write_tombstones(
                [tombstone_of(lease.key) for _, lease in taken], outcomes, taken, inline
            )
        self.engine.emit("released", self.name, [i for i, _ in taken])
        return fut

    def requeue(
        self, items: Sequence[Requeue], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        """Hand leased items back at the deadline each one asks for; one outcome per
        item."""

        def where(r: Requeue, now: int) -> Callable[[Lease], tuple[int, Reason | None]]:
            deadline = resolve_deadline(r.deadline, r.delay_ms, now)  # refused before the lease
            return lambda _lease: (deadline, None)

        return self._move_leases(items, where, inline)

    def fail(
        self, items: Sequence[Fail], inline: InlineCommits | None = None
    ) -> Future[list[ItemOutcome]]:
        """Hand leased items back under the retry policy (``item_notes.retry_deadline``),
        each with its error added to its reasons; one outcome per item, with its next
        deadline. The errors were checked by the caller (``reasons.check_error``)."""

        def where(f: Fail, now: int) -> Callable[[Lease], tuple[int, Reason | None]]:
            return lambda lease: (
                retry_deadline(self.config, lease, now),
                Reason(f.error, now, lease.dequeue_count),
            )

        return self._move_leases(items, where, inline)

    def _move_leases(
        self,
        items: Sequence[Requeue] | Sequence[Fail],
        where: Callable[[Any, int], Callable[[Lease], tuple[int, Reason | None]]],
        inline: InlineCommits | None,
    ) -> Future[list[ItemOutcome]]:
        """End the leases ``items`` name and move each item to the deadline ``where``
        gives it (with the reason it adds, if any), in one record: what requeue and fail
        share. ``where(item, now)`` checks what the item asks for (a refusal is a
        ``StorageError``) and returns what its lease then makes of it. An item refused,
        or whose lease does not check, gets the error as its outcome and stays where it
        is."""
        now = self.engine.now()
        results: dict[int, ItemOutcome] = {}
        order: list[int] = []
        with self.lock:
            self.check_open()
            leases = self.deliveries.leases
            moves: list[tuple[int, Lease, int, Reason | None]] = []
            taken: list[tuple[int, Lease]] = []
            for item in items:
                order.append(item.id)
                try:
                    moving = where(item, now)
                    lease = leases.take(item.id, item.receipt, self.commit.next_id, now)
                except StorageError as exc:
                    results[item.id] = ItemOutcome(item.id, exc.code, exc.message)
                    continue
                taken.append((item.id, lease))
                moves.append((item.id, lease, *moving(lease)))
            moved: list[ItemOutcome] = []
            built = self.frames.moves(moves, now, moved)
            for o in moved:
                results[o.id] = o
            outcomes = [
                results.get(i, ItemOutcome(i, "item_not_found", "value not found")) for i in order
            ]
            if built is None:
                if taken:  # nothing to write: the leases ended here
                    self._slots_freed(taken, now)
                return resolved(outcomes)
            fut = self._write_moves(built, outcomes, taken, inline)
        self.engine.emit("requeued", self.name, [o.id for o in moved])  # a fail is a requeue
        return fut

    def extend(self, items: Sequence[Extend]) -> list[ItemOutcome]:
        now = self.engine.now()
        with self.lock:
            self.check_open()
            return self.deliveries.extend(items, self.commit.next_id, now)

    def expire_leases(self) -> int:
        now = self.engine.now()
        with self.lock:
            if self.health.closed or self.health.failed is not None:
                return 0
            n = self.requeue_expired(now)
        return n

    def requeue_expired(self, now: int) -> int:
        """Move every item whose lease ran out by ``now`` back — due now, or as the
        retry policy says — its delivery count kept and "lease expired" added to its
        reasons (call under the lock). How many leases ran out."""
        expired = self.deliveries.leases.pop_expired(now)
        if not expired:
            return 0
        self.lease_expired += len(expired)
        moved: list[ItemOutcome] = []
        config = self.config
        moves = [
            (
                i,
                lease,
                retry_deadline(config, lease, now),
                Reason(LEASE_EXPIRED, now, lease.dequeue_count),
            )
            for i, lease in expired
        ]
        built = self.frames.moves(moves, now, moved)
        if built is not None:
            try:
                self._write_moves(built, moved, expired)
            except ReplicationStalled:
                # a stalled replica group takes no write: the leases are put back as
                # they were (expired), and a later look moves their items again
                self.lease_expired -= len(expired)
                return 0
            if built.groups and self.config.group_limit is not None:
                # back ahead of their groups' later items (``docs/delivery.md``)
                self.deliveries.index.returning(built.groups)
            self.engine.emit("lease_expired", self.name, [o.id for o in moved])
        else:
            self._slots_freed(expired, now)
        return len(expired)

    def rebuild_returning(self) -> None:
        """Mark again the items a lease expiry wrote back that the cursor has not reached,
        read from what is stored (``storage/returning.py``), so each comes back ahead of
        its group's later items after a restart and when a follower starts to lead
        (call under the lock, or before the queue serves)."""
        index = self.deliveries.index
        found: dict[bytes, str] = {}
        if self.config.group_limit is not None and self.meta.errors.notes:
            files = self.files
            found = returning_entries(
                self.meta.errors.notes,
                self.deliveries.cursor,
                self.item_reasons,
                files.count,
                lambda key: files.group_of(key, None),
            )
        if found or index.returning_count:
            index.rebuilt_returning(found, self.engine.now())

    def _write_moves(
        self,
        built: Moves,
        result: Any,
        restore: list[tuple[int, Lease]],
        inline: InlineCommits | None = None,
    ) -> Future[Any]:
        """Submit a record of moves (``MoveFrames.moves``, ``MoveFrames.batch``); a
        refusal gives back ``restore``, and what memory said of the items' keys and
        reasons."""
        batch, carrying = self.frames.batch(built, result, restore)
        try:
            return self._submit(batch, built.payload, built.meta, inline)
        except BaseException:
            carrying.give_back()
            raise

    # ------------------------------------------------------------------ tombstones

    def tombstone_keys(self, keys: list[bytes]) -> Future[Any]:
        """Cancel delivered pending entries (a move to a dead-letter queue)."""
        with self.lock:
            self.check_open()
            return self._write_tombstones([tombstone_of(k) for k in keys], None, None)

    def cancel_leased(self, item_ids: Sequence[int]) -> Future[Any]:
        """Cancel leased items without their receipts (an operator's delete or purge):
        their leases end (receipts go stale) and their entries get tombstones. A refused
        write (a stalled replica group) gives the leases back. Call under the lock, the
        queue checked open."""
        leases = self.deliveries.leases
        taken = [(i, leases.pop(i)) for i in item_ids]
        tombs = [tombstone_of(lease.key) for _, lease in taken]
        return self._write_tombstones(tombs, None, taken)

    def cancel_ahead(
        self, pkeys: list[bytes], result: Any = None, meta: bytes = b""
    ) -> Future[Any]:
        """Cancel live, unleased items (ahead of the dequeue cursor, or held back by the
        delivery rules behind it: an operator's delete, purge or redrive). Their
        tombstones are kept in the in-memory segment (the view must see them to skip
        the items), held ones leave the delivery index at once (put back if the write
        is refused), and until their record is published the first key is a barrier
        dequeue does not pass, so no consumer leases an item whose removal is in
        flight. ``meta``: metadata entries of the same record (a cancel by key's). Call
        under the lock, the queue checked open."""
        tombs = [tombstone_of(k) for k in pkeys]
        unheld = self._unhold(pkeys)
        token = self.commit.hold(min(pkeys))
        batch = PendingBatch(
            self.files.memseg,
            result,
            entries=[(t, None, None) for t in tombs],
            token=token,
            unheld=unheld,
        )
        return self._submit(batch, b"".join(tombs), meta)

    def _unhold(self, pkeys: list[bytes]) -> list[tuple[bytes, str | None, int]] | None:
        """Take the live entries ``pkeys`` that are about to be cancelled or moved out of
        the delivery index: those behind the cursor (held back by the rules) or on their
        way back from a lease; what was removed (None: nothing), to put back if the
        record is refused."""
        cursor = self.deliveries.cursor
        index = self.deliveries.index
        behind = [k for k in pkeys if k <= cursor or index.is_returning(k)]
        if not behind:
            return None
        group_of = self.files.group_of
        return index.remove([(k, group_of(k, None)) for k in behind], self.engine.now()) or None

    def _write_tombstones(
        self,
        tombs: list[bytes],
        result: Any,
        restore: list[tuple[int, Lease]] | None,
        inline: InlineCommits | None = None,
    ) -> Future[Any]:
        """Append the record of ``tombs`` (under the lock, the queue checked open); a
        refusal gives back ``restore``."""
        batch = PendingBatch(self.files.memseg, result, behind=len(tombs), restore=restore)
        return self._submit(batch, b"".join(tombs), b"", inline)

    # ------------------------------------------------------------------ reads

    def dequeue(self, count: int, lease_ms: int | None) -> list[Delivery]:
        """Lease up to ``count`` due items in key order (``Deliveries.take``); items
        delivered ``max_deliveries`` times go to the dead-letter queue instead."""
        now = self.engine.now()
        lease_ms = self.config.default_lease_ms if lease_ms is None else lease_ms
        if type(lease_ms) is not int or not 1 <= lease_ms <= MAX_LEASE_MS:
            check_lease_ms(lease_ms)  # raises, in the rule's words
        with self.lock:
            health = self.health
            if health.failed is not None or health.closed:
                self.check_open()
            expiry = self.deliveries.leases.next_expiry()
            if expiry is not None and expiry <= now:  # a lease ran out
                self.requeue_expired(now)
            if self.state.paused:
                return []  # a paused queue hands out nothing; lease expiry still runs
            out, dead = self.deliveries.take(
                self.files.view,
                encode_key(now, MAX_ID, TOMBSTONE),
                self.commit.barrier(),
                count,
                now + lease_ms,
                now,
                self.config.max_deliveries,
                self.files.lookup,
            )
            if out:
                self.rates.add("dequeue", len(out), now)
                if self.meta.errors.notes:
                    self._annotate(out)
            why: dict[int, tuple[Reason, ...]] = {}  # a dead letter keeps its reasons
            for entry in dead:
                reasons = self.item_reasons(key_id(entry[0]))
                if reasons:
                    why[key_id(entry[0])] = reasons
        if dead:
            self.engine.dead_letter(self, dead, why)
        return out

    # ------------------------------------------------------------------ items' reasons

    def item_reasons(self, item_id: int) -> tuple[Reason, ...] | None:
        """Why item ``item_id`` failed, newest first (None: it never did); under the
        lock. Read from the sidecar of the log they were written in once it is frozen."""
        errors = self.meta.errors
        if item_id not in errors.notes:
            return None
        return errors.reasons(self.directory, item_id)

    def _annotate(self, out: Sequence[Delivery]) -> None:
        """Give each delivery its item's last error (under the lock)."""
        notes = self.meta.errors.notes
        if not notes:
            return
        for d in out:
            if d.id in notes:
                reasons = self.item_reasons(d.id)
                if reasons:
                    d.last_error, d.last_error_at = reasons[0].error, reasons[0].at

    def next_wakeup(self) -> int | None:
        now = self.engine.now()
        with self.lock:
            return self.deliveries.next_wakeup(self.files.view, self.state.paused, now)

    def stats(self) -> QueueStats:
        # A segment file's counts decode its blocks the first time (after a restart, a
        # freeze or a merge): done here without the lock, for the keys this count will
        # ask, so the writes and reads of the queue go on meanwhile
        # (``storage/segment_counts.py``); the count under the lock then decodes nothing.
        with self.lock:
            cursor = self.deliveries.cursor
            head = self.files.view.peek(cursor)
            probes = self.state_counter.probes(
                cursor, self.engine.now(), None if head is None else head[0]
            )
            learning = [r.counts for r in self.files.segments]
        for counts in learning:
            counts.learn(probes)
        now = self.engine.now()
        with self.lock:
            files = self.files
            mems = files.memsegs()
            cursor = self.deliveries.cursor
            head = files.view.peek(cursor)
            counted = self.state_counter.count(
                [*mems, *(r.counts for r in files.segments)],
                cursor,
                now,
                None if head is None else head[0],
            )
            leased = len(self.deliveries.leases)
            index = self.deliveries.index
            due, oldest_due, held = counted.due, counted.oldest_due, 0
            if index.active:  # held items are due, behind the cursor
                due += index.indexed
                first = index.oldest_key()
                if first is not None:
                    d = key_deadline(first)
                    oldest_due = d if oldest_due is None else min(oldest_due, d)
                held = index.held_back(now)
                if index.at_leased_limit() or index.queue_token_at(now) is not None:
                    held += counted.due  # nothing more goes out now
            oldest = None if oldest_due is None else now - oldest_due
            disk = sum(r.file_size for r in files.segments)
            disk += self.commit.wal.size if self.health.loaded else 0
            for path, _m in files.frozen:
                try:
                    disk += os.path.getsize(path)
                except OSError:
                    pass
            return QueueStats(
                name=self.name,
                config=self.config,
                pending=counted.pending,
                due=due,
                delayed=counted.delayed,
                leased=leased,
                segments=len(files.segments),
                bytes_on_disk=disk,
                oldest_due_age_ms=oldest,
                next_id=self.commit.next_id,
                groups=index.named_groups,
                held=held,
                rate_limited=index.rate_refused,
                extra={
                    "frozen": len(files.frozen),
                    "memseg_entries": len(files.memseg),
                    "memory_bytes": sum(m.bytes for m in mems),
                    "failed": int(self.health.failed is not None),
                    "damaged": int(self.health.quarantined),
                    "io_errors": self.health.io_errors,
                    "freeze_failures": files.freeze_failures,
                    "rotation_failures": files.rotation_failures,
                    "recoveries": self.health.recoveries,
                },
            )

    # ------------------------------------------------------------------ the write path

    def hold(self, key: bytes) -> int:
        """Bar dequeue from passing ``key`` until ``unhold`` (the token returned): for
        a write whose entries are not published yet. Call under the lock."""
        return self.commit.hold(key)

    def unhold(self, token: int) -> None:
        """Lift the barrier ``hold`` returned ``token`` for (no matter if lifted already)."""
        self.commit.unhold(token)

    def _submit(
        self,
        batch: PendingBatch,
        payload: bytes,
        meta: bytes = b"",
        inline: InlineCommits | None = None,
    ) -> Future[Any]:
        """Append ``batch``'s record (under the lock); its future resolves with
        ``batch.result`` once it is durable per the fsync mode and published.

        ``always``: the batch waits for the next sync round: the one the calling thread
        runs itself if it passed its ``inline`` commits (the event loop), else the syncer
        thread's. Otherwise the record is written at once and the batch published; a
        failed write fails the queue. A refused batch is rolled back.
        """
        commit = self.commit
        try:
            commit.append(batch, payload, meta)
        except ReplicationStalled:
            self.failing.roll_back(batch)
            raise
        mode = self.engine.config.fsync
        if mode == "always":
            if inline is None or not inline.take(self):
                assert self.engine.syncer is not None
                self.engine.syncer.mark_dirty(self)
        else:
            try:
                commit.write_now()
            except BaseException as exc:
                self.failing.roll_back(batch)
                answer(self.failing.fail(exc, "writing the log"))
                if isinstance(exc, StorageError):
                    raise
                assert self.health.failed is not None
                raise self.health.failed from exc
            self._publish(batch)
            batch.future.settle(batch.result)
            if mode == "interval" and self.engine.syncer is not None:
                self.engine.syncer.mark_dirty(self)
        jobs = self.jobs
        if jobs.fill() >= self.engine.config.memseg_bytes:
            answer(jobs.request_rotation())
        return batch.future

    def _publish(self, batch: PendingBatch) -> None:
        """Make a durable batch's entries visible (under the lock), lift its barrier, and
        tell the watchers if it made entries due (each publication wakes one waiting
        long-poll, ``storage/waits.py``)."""
        mem = batch.mem
        groups = batch.groups  # the entries' groups (``docs/delivery.md``)
        if batch.keyed is not None:
            if groups:
                mem.add_pending(batch.keyed, batch.stats, [groups.get(k) for k, _v in batch.keyed])
            else:
                mem.add_pending(batch.keyed, batch.stats)
        if batch.entries is not None:
            add = mem.add
            if groups:
                for key, stats, value in batch.entries:
                    add(key, stats, value, groups.get(key))
            else:
                for key, stats, value in batch.entries:
                    add(key, stats, value)
        if batch.behind:
            mem.add_tombstones_behind(batch.behind)
        if batch.remembered is not None:
            for entry in batch.remembered:  # committed: a repeat is answered at once
                entry.pending = None
        if batch.load_meta:
            where = f"replicated record of queue {self.name}"
            log_no = batch.wal.segment_no if batch.wal is not None else 0
            now, window = self.engine.now(), self.config.dedup_window_ms
            self.meta.load(batch.load_meta, where, now, window, log_no)
        if batch.token:
            self.commit.unhold(batch.token)
        freed = batch.restore is not None and self.deliveries.ended(
            batch.restore, self.engine.now()
        )
        if (batch.wakes or freed) and self.watchers:
            self.woke = True
            self.notify()

    def _slots_freed(self, taken: list[tuple[int, Lease]], now: int) -> None:
        """Leases ended with nothing to write (their item's value was not found): their
        slots are free now."""
        if self.deliveries.ended(taken, now):
            self.notify()

    def _published(self, batches: list[PendingBatch]) -> list[Answer]:
        """Publish ready batches in order; their answers (settle them outside the lock)."""
        publish = self._publish
        done: list[Answer] = []
        for batch in batches:
            publish(batch)
            done.append((batch.future, batch.result, None))
        return done

    def _complete(self, wal: WalWriter, seq: int) -> list[Answer]:
        """``wal`` is synced up to ``seq``: publish what is now ready, in order; return
        the answers (settle them outside the lock). ``_published``'s loop, written out:
        a sync round of one write runs it once per write."""
        publish = self._publish
        done: list[Answer] = []
        for batch in self.commit.synced(wal, seq):
            publish(batch)
            done.append((batch.future, batch.result, None))
        return done

    def notify(self) -> None:
        """Tell the watchers (``Engine.watch``) that entries were published."""
        for cb in list(self.watchers):
            try:
                cb()
            except Exception:
                log.exception("queue watcher failed")

    def sync_round(self) -> float:
        """Called by the syncer: write and sync what is buffered, then publish it.
        Returns the seconds the write and the sync took (a committing thread backs off
        a slow disk with it, ``storage/syncer.py``). Any write or sync error fails the
        queue, in every mode (``Failing.fail``); with ``always`` a rotation asked for is
        carried out here (``FileJobs.begin_rotation``), the batches its closed log made
        durable published between its two steps."""
        commit, health = self.commit, self.health
        with self.lock:
            if not health.loaded or health.failed is not None or health.closed:
                return 0.0
            wal, data, seq = commit.take_round()
        started = time.perf_counter()
        error = commit.write_round(wal, data)
        took = time.perf_counter() - started
        with self.lock:
            self.woke = False
            if error is not None:
                answers = self.failing.fail(error, "syncing the log")
                published = any(e is None for _f, _r, e in answers)
            elif self.engine.config.fsync == "always":
                answers = self._complete(wal, seq)
                published = bool(answers)
                if self.files.rotate_requested and not health.closed and health.failed is None:
                    refused, rotation = self.jobs.begin_rotation()
                    answers += refused
                    if rotation is not None:
                        done = self._complete(rotation.old, rotation.old.appended_seq)
                        published = published or bool(done)
                        answers += done
                        self.jobs.end_rotation(rotation)
            else:
                answers, published = [], False
            if published and not self.woke and self.watchers:  # a publication wakes once
                self.notify()
        answer(answers)
        return took

    # ------------------------------------------------------------------ a replica group's leader (``ReplicaLeader``)

    def publish_committed(self, now: float) -> list[Answer]:
        """The replica group's commit lsn moved (``Engine.commit``): publish what is now
        synced and committed, and answer ``ReplicationTimeout`` to replicated writes
        that waited past their deadline (``now``, monotonic seconds). Call under the
        lock; settle the answers once it is let go."""
        answers = self._published(self.commit.ready())
        if answers:
            self.notify()
        return answers + self.commit.overdue(now)

    def snapshot_into(self, dest: str) -> int:
        """Copy this queue's files into the empty directory ``dest`` for a follower that
        (re)joins (``ReplicaLeader.copy_into``); return the lsn of the last record the
        copy holds. A damaged queue is copied as it lies on disk."""
        with self.lock:
            if not self.health.quarantined:
                self.check_open()
            return self.leader.copy_into(dest)

    # ------------------------------------------------------------------ a replica group's follower

    def apply_record(self, kind: int, body: bytes) -> Future[Any]:
        """Append one of the leader's records exactly as the leader framed it, through
        the same group commit as any write (``ReplicaFollower``); resolved (None) once
        it is durable. Refused with ``WriteStall`` while this queue's writes are stalled,
        by the leader's own rule (``FileJobs.refuse_if_stalled``): the caller waits it
        out before the next record (``ReplicaEngine.apply``), so a follower whose
        compaction worker lags holds its log and in-memory segment within the bound a
        leader keeps, and the leader's writes wait for it as for a slow disk."""
        record = self.follower.read(kind, body)
        with self.lock:
            self.check_open()
            self.jobs.refuse_if_stalled()
            return self._submit(self.follower.batch(record), record.entries, record.meta)

    @property
    def segments(self) -> list[SegmentReader]:
        """The segment files, oldest first (for tools and tests; ``files`` has them)."""
        return self.files.segments

    # ------------------------------------------------------------------ file jobs (``FileJobs``)

    def freeze_now(self, timeout: float = 30.0) -> None:
        """Rotate the log now (``Engine.freeze``); waits until the rotation is done."""
        with self.lock:
            self.check_open()
            answers = self.jobs.request_rotation()
        answer(answers)
        self.jobs.await_rotation(timeout)

    def unfrozen_logs(self) -> list[int]:
        """Numbers of logs that have no segment file yet (``MergeSource``)."""
        return self.jobs.unfrozen_logs()

    def segment_descriptions(self) -> list[SegmentDesc]:
        """The segment files, oldest first, as the merge policy sees them."""
        return self.jobs.descriptions()

    def merge_idle(self) -> bool:
        """True when a merge could start now (``FileJobs.merge_idle``)."""
        return self.jobs.merge_idle()

    def merge(self, start: int, stop: int, *, wait: bool = True) -> Future[Any] | None:
        """Merge ``segments[start:stop]`` (a contiguous range) into one segment file on
        the compaction worker (``SegmentSet.start_merge`` says which ranges may)."""
        with self.lock:
            self.check_open()
            taken = self.files.start_merge(start, stop)
            if taken is None:
                return None
        return self.jobs.merge(*taken, wait=wait)

    # ------------------------------------------------------------------ failing and reopening

    @property
    def failed(self) -> StorageError | None:
        """Why the queue refuses work, or None (``Health``)."""
        return self.health.failed

    @property
    def quarantined(self) -> bool:
        """Damaged on disk: it refuses work until an operator repairs it and restarts."""
        return self.health.quarantined

    def check_open(self) -> None:
        """Raise why the queue refuses work, if it does (a failed queue whose reopening
        is due is reopened first). Call under the lock."""
        if self.health.failed is not None:
            self._recover_locked()
        if self.health.failed is not None:
            raise self.health.failed
        if self.health.closed:
            raise EngineUnavailable("queue is closed", queue=self.name)

    def recover_if_due(self) -> None:
        """Reopen a failed queue from disk when its retry is due (the restart path)."""
        with self.lock:
            self._recover_locked()

    def _recover_locked(self) -> None:
        health = self.health
        if health.closed or not health.recovery_due() or self.files.merging:
            return
        try:
            if health.loaded:
                self.commit.cut_back()
            self.files.drop()
            health.loaded = False
            self._load()
        except CorruptionError as exc:
            health.quarantine(exc)
            return
        except Exception as exc:
            health.reopen_failed(exc)
            return
        health.reopened()

    # ------------------------------------------------------------------ settings

    def set_config(self, config: QueueConfig) -> None:
        """Replace the queue's config, durably (``queue.json``), and deliver by its rules
        from now on (waiting long-polls look again); call under the lock."""
        save_config(self.directory, config)
        self.config = config
        self.deliveries.index.configure(config, self.engine.now())
        self.notify()

    def set_state(self, state: QueueState) -> None:
        """Replace the queue's operator state, durably (``state.json``); call under the
        lock."""
        save_state(self.directory, state)
        self.state = state

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` after ``delay`` seconds, unless the queue has closed by then
        (``Timers``)."""
        self.timers.call_later(delay, fn)

    # ------------------------------------------------------------------ closing

    def close(self) -> None:
        health = self.health
        with self.lock:
            if health.closed:
                return
            self.jobs.stop_merge()
        self.engine.compactor.wait_idle(timeout=120)
        answers: list[Answer] = []
        with self.lock:
            health.closed = True
            self.timers.close()
            if health.loaded and health.failed is None:
                wal = self.commit.wal
                try:
                    wal.close(sync=self.engine.config.fsync != "never")
                    answers = self._complete(wal, wal.appended_seq)
                except Exception as exc:
                    answers = self.failing.fail(exc, "closing the log")
            elif health.loaded:
                self.commit.wal.abandon()
            gone = EngineUnavailable("queue is closed", queue=self.name)
            # on a replica group's leader, a write still waiting for its sync set is on
            # the followers: closed under it (a deletion), its outcome is unknown
            in_doubt = ReplicationTimeout(
                "the queue was closed before the replica group acknowledged the write; "
                "its outcome is unknown",
                queue=self.name,
            )
            answers += [
                (b.future, None, in_doubt if b.lsn else gone) for b in self.commit.refuse_all()
            ]
            self.files.close()
            fileio.remove(self.jobs.cancel_marker)
        answer(answers)
