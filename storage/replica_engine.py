"""The engine's part in a replica group (``docs/replication.md``).

A node is a leader, a follower, or alone (no replication: exactly the single-node
engine). The server's replication package decides which and calls these methods; the
engine itself never talks to another machine.

- **Role** (``set_role``): a follower refuses every client write and dequeue with
  ``NotLeader`` naming the leader, so nothing reaches its logs but the leader's records.
  A leader is given its term's liveness (``alive``: its etcd lease surely lives) and asks
  it at every write and dequeue: a process woken from a stall past its lease may run
  requests before anything has told it that it lost the lead, and a dequeue needs no
  commit from the followers that would stop it, so without the question it could hand
  out leases while the next leader hands out the same items (``docs/delivery.md``,
  "Failover in a replica group").
- **Leader** (``set_replication``, ``commit``): every record a queue appends, and
  every queue-level change, is shipped to the sink under the queue's lock, in log
  order; a write publishes and is answered only once it is synced locally *and*
  ``commit`` says the sync set has it. Queue-level changes (create, config, pause,
  delete) wait for their own commit before they return.
- **Follower** (``apply``, ``replace_queues``): the leader's records are appended to the
  follower's own logs; a follower that (re)joins first replaces all its queues with a
  copy of the leader's (``snapshot`` on the leader).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, cast

from dq.storage import fileio
from dq.storage.errors import (
    EngineUnavailable,
    InvalidArgument,
    NotLeader,
    ReplicationTimeout,
    WriteStall,
)
from dq.storage.futures import after_all, answer
from dq.storage.queue import Queue
from dq.storage.queue_config import config_from_json
from dq.storage.queue_state import QueueState
from dq.storage.replication import (
    KIND_CONTROL,
    Frame,
    ReplicationSink,
    control_frame_payload,
    decode_control,
)
from dq.storage.types import QueueConfig

if TYPE_CHECKING:
    from dq.storage.config import EngineConfig
    from dq.storage.queue import QueueHost

__all__ = ["SCRATCH_PREFIX", "ReplicaEngine", "restore_replaced_queues"]

log = logging.getLogger("dq.storage.replication")

#: names in the data directory the replica layer may use for scratch space (copies in
#: flight); the engine deletes whatever is left of them when it opens
SCRATCH_PREFIX = ".replica-"
#: where ``replace_queues`` moves the queues it replaces, until the copy is in place
_OLD_QUEUES = SCRATCH_PREFIX + "old-"
#: how often a record refused for a write stall is tried again, as a leader's write is
_STALL_NAP_S = 0.005


def restore_replaced_queues(root: str) -> bool:
    """A crash between ``replace_queues``' two renames leaves no ``queues/``: put the
    replaced queues back (the newest, if several) before anything cleans scratch space
    up, so a node never comes back empty. True if it did."""
    if not os.path.isdir(root):
        return False
    olds = sorted(
        (n for n in os.listdir(root) if n.startswith(_OLD_QUEUES)),
        key=lambda n: int(n[len(_OLD_QUEUES) :]) if n[len(_OLD_QUEUES) :].isdigit() else -1,
    )
    if not olds:
        return False
    fileio.rename(os.path.join(root, olds[-1]), os.path.join(root, "queues"))
    fileio.fsync_dir(root)
    log.warning("put back the queues a replica copy was replacing when the process stopped")
    return True


class ReplicaEngine:
    """The replica-group calls of ``Engine``; see the module docstring."""

    if TYPE_CHECKING:
        root: str
        closed: bool
        config: EngineConfig
        _lock: threading.RLock
        _queues: dict[str, Queue]

        def _create(self, name: str, config: QueueConfig) -> Queue: ...
        def _delete(self, name: str) -> None: ...
        def _open_queues(self) -> None: ...
        def _apply_schedule_control(self, queue: str, op: dict[str, Any]) -> bool: ...
        def _forget_schedules(self, queue: str | None) -> None: ...

    def _init_replica(self) -> None:
        #: the leader's replicator, or None
        self.replication: ReplicationSink | None = None
        #: the highest lsn the sync set holds
        self.commit_lsn = 0
        #: False on a follower: client writes and dequeues answer ``NotLeader``
        self.writable = True
        #: the leader's URL as a follower knows it (None while unknown)
        self.leader_url: str | None = None
        #: a leader's term is surely not over while this says so (None: not asked)
        self._alive: Callable[[], bool] | None = None
        #: writable with no term to ask about: the hot paths' one test before they skip
        #: ``_check_writable`` (a leader given ``alive`` must ask it at every call)
        self.plainly_writable = True
        self._committed = threading.Condition()
        #: queues whose memory lacks records their log holds (``set_replication``)
        self._dropped: set[str] = set()

    # ------------------------------------------------------------------ role

    def set_role(
        self, writable: bool, leader: str | None = None, alive: Callable[[], bool] | None = None
    ) -> None:
        """Make this node take client writes (a leader, or alone) or refuse them with
        ``NotLeader(leader)`` (a follower). ``alive``: a leader's term may be over once
        it answers False; writes and dequeues are refused from then on, even before the
        role is taken away (see the module docstring)."""
        if writable and not self.writable:
            # the items the last leader's lease expiries wrote back come first in their
            # groups here too (``docs/delivery.md``), before the first dequeue
            for q in list(self._queues.values()):
                with q.lock:
                    if q.health.loaded:
                        q.rebuild_returning()
        self.leader_url = leader
        self._alive = alive if writable else None
        self.writable = writable
        self.plainly_writable = writable and self._alive is None

    def check_writable(self) -> None:
        """Raise ``NotLeader`` on a follower: for server-side state kept beside the
        engine (consumer groups) that must refuse exactly when the engine does."""
        self._check_writable()

    def _check_writable(self) -> None:
        alive = self._alive
        if not self.writable or (alive is not None and not alive()):
            if self.leader_url is None:  # answered 503 no_leader: there is no "there"
                raise NotLeader(
                    "this node knows no leader of the replica group now (an election is "
                    "running, or etcd cannot be reached): retry shortly, here or on "
                    "another member"
                )
            raise NotLeader(
                "this node follows the replica group's leader: send writes and dequeues there",
                leader=self.leader_url,
            )

    # ------------------------------------------------------------------ leader

    def set_replication(self, sink: ReplicationSink | None) -> None:
        """Start (or stop, with None) shipping every record to ``sink``; lsns start
        again from the sink's numbering.

        Writes still waiting for the previous sink's commit are answered
        ``ReplicationTimeout`` (their outcome is unknown) and dropped from memory, so
        an lsn of one epoch is never compared with the commits of another. Their
        records stay in the log: a node that follows next replaces its queues with the
        leader's copy; a node that leads again must first ``restore_dropped`` so its
        memory (items, ids, idempotency keys) is its log again.
        """
        if sink is not None and self.config.fsync != "always":
            raise InvalidArgument("replication needs fsync 'always'", fsync=self.config.fsync)
        lost = ReplicationTimeout(
            "this node stopped leading before the replica group acknowledged the write; "
            "its outcome is unknown"
        )
        answers = []
        with self._lock:
            queues = list(self._queues.values())
            for q in queues:
                q.lock.acquire()
            try:
                self.replication = sink
                with self._committed:
                    self.commit_lsn = 0
                    self._committed.notify_all()
                for q in queues:
                    dropped = q.leader.drop_replicated(lost)
                    if dropped:
                        self._dropped.add(q.name)
                    answers += dropped
            finally:
                for q in queues:
                    q.lock.release()
        answer(answers)

    def commit(self, lsn: int, sink: ReplicationSink | None = None) -> None:
        """The sync set holds every record up to ``lsn``: publish and answer what was
        waiting for it. Also answers ``ReplicationTimeout`` to writes that waited too
        long, so the replicator calls it on a tick even when nothing advances.

        With ``sink``, the commit counts only while the engine still ships to that
        sink: an epoch's replicator can never publish the next epoch's records (lsns
        start again at 1). The check is made under each queue's lock, which
        ``set_replication`` takes too."""
        with self._committed:
            if sink is not None and self.replication is not sink:
                return
            if lsn > self.commit_lsn:
                self.commit_lsn = lsn
                self._committed.notify_all()
        now = time.monotonic()
        for q in list(self._queues.values()):
            if not q.leader.awaits_commit():
                continue
            with q.lock:
                if sink is not None and self.replication is not sink:
                    return
                answers = q.publish_committed(now)
            answer(answers)

    def _ship_control(self, name: str, op: str, **fields: Any) -> int:
        """Ship a queue-level change (call under the lock that orders it); its lsn."""
        sink = self.replication
        if sink is None:
            return 0
        return sink.ship(name, KIND_CONTROL, control_frame_payload(op, **fields))

    def _await_commit(self, lsn: int, sink: ReplicationSink | None) -> None:
        """Block until the sync set holds ``lsn``, which ``sink`` numbered (read
        ``self.replication`` under the lock the change was shipped under); never call
        this on an event loop. If the node stops shipping to ``sink`` first, the change's
        outcome is unknown: another epoch's commit lsn says nothing about it."""
        if lsn == 0 or sink is None:
            return
        deadline = time.monotonic() + sink.commit_timeout_s
        with self._committed:
            while self.commit_lsn < lsn or self.replication is not sink:
                left = deadline - time.monotonic()
                if left <= 0 or self.replication is not sink:
                    raise ReplicationTimeout(
                        "the replica group's sync set did not acknowledge the change in "
                        "time; its outcome is unknown"
                    )
                self._committed.wait(min(left, 0.1))

    def snapshot(self, dest: str) -> dict[str, int]:
        """Copy every queue into ``dest/queues/<queue>/`` (``dest`` inside the data
        directory, so immutable files are hard links); return ``{queue: lsn of the last
        record its copy holds}``. Each queue's copy is taken under its lock."""
        out: dict[str, int] = {}
        qdest = os.path.join(dest, "queues")
        os.makedirs(qdest, exist_ok=True)
        with self._lock:  # a creation ships and joins ``_queues`` under this lock
            queues = sorted(self._queues.items())
        for name, q in queues:
            target = os.path.join(qdest, name)
            for attempt in range(5):
                shutil.rmtree(target, ignore_errors=True)
                os.makedirs(target)
                try:
                    out[name] = q.snapshot_into(target)
                    break
                except FileNotFoundError:  # a merge removed an input meanwhile: again
                    if attempt == 4:
                        raise
                except EngineUnavailable:
                    if self.closed or self._queues.get(name) is q:
                        raise
                    # deleted since the listing: its deletion (and any new queue of
                    # that name) is in the stream after the snapshot's lsn
                    shutil.rmtree(target, ignore_errors=True)
                    break
        return out

    # ------------------------------------------------------------------ follower

    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]:
        """Append the leader's frames (in lsn order) to this node's logs; the future
        resolves once every record is durable. Queue-level changes apply at once.

        A queue whose writes are stalled (its closed logs wait for their segment files,
        ``FileJobs.refuse_if_stalled``) takes its next record only once the stall is
        over, so the follower's logs and in-memory segments keep the leader's bound.
        Meanwhile it acknowledges nothing more: the leader's writes wait for it as for
        a slow disk, and past the group's replica timeout it leaves the sync set
        (``docs/replication.md``). The pull loop passes ``stopping`` (it no longer
        follows this leader) and waits as long as the stall lasts: a refused record
        would only come back, and a resync would wait for the same compaction worker;
        without ``stopping`` one record waits at most ``wait_timeout_s``, as a blocking
        write does (``Engine.enqueue``). Either way the wait ends in ``WriteStall``; the
        records before the refused one are appended, and a caller that gets it
        acknowledges none of ``frames``."""
        waits: list[Future[Any]] = []
        for frame in frames:
            if frame.kind == KIND_CONTROL:
                self._apply_control(frame)
                continue
            q = self._queues.get(frame.queue)
            if q is None:
                q = self._create(frame.queue, QueueConfig())
            waits.append(self._apply_record(q, frame, stopping))
        return after_all(waits, None)

    def _apply_record(
        self, q: Queue, frame: Frame, stopping: Callable[[], bool] | None
    ) -> Future[Any]:
        """``q.apply_record`` of ``frame``, a write stall waited out (see ``apply``)."""
        give_up = time.monotonic() + self.config.wait_timeout_s
        while True:
            try:
                return q.apply_record(frame.kind, frame.payload)
            except WriteStall:
                if stopping is None and time.monotonic() > give_up:
                    raise
                if stopping is not None and stopping():
                    raise
                time.sleep(_STALL_NAP_S)

    def _apply_control(self, frame: Frame) -> None:
        op = decode_control(frame)
        name = frame.queue
        kind = op["op"]
        if kind == "put_queue":
            config = config_from_json(op["config"])
            q = self._queues.get(name)
            if q is None:
                self._create(name, config)
            else:
                with q.lock:
                    q.set_config(config)
        elif kind == "delete_queue":
            if name in self._queues:
                self._delete(name)
        elif kind == "paused":
            q = self._queues.get(name)
            if q is None:
                q = self._create(name, QueueConfig())
            with q.lock:
                paused = bool(op["paused"])
                if paused != q.state.paused:
                    q.set_state(
                        QueueState(paused_since=int(op.get("since") or 1))
                        if paused
                        else QueueState()
                    )
        elif not self._apply_schedule_control(name, op):
            log.warning("ignoring unknown replicated change %r of queue %s", kind, name)

    def restore_dropped(self) -> list[str]:
        """Reopen from their files the queues whose waiting writes a change of sink
        dropped, so what this node serves and ships (its snapshots copy the log) is
        one and the same: those writes become items with their ids and idempotency
        keys. Call it before leading again, off the event loop (it closes and opens
        queues). Returns the queues it reopened."""
        with self._lock:
            names = sorted(self._dropped)
            self._dropped.clear()
        reopened = []
        for name in names:
            q = self._queues.get(name)
            if q is None:
                continue
            q.close()
            fresh = Queue.open(cast("QueueHost", self), name, q.directory)
            with self._lock:
                if self._queues.get(name) is q:
                    self._queues[name] = fresh
                    reopened.append(name)
            log.warning("queue %s reopened from its files: writes in doubt are kept", name)
        return reopened

    def replace_queues(self, src: str) -> None:
        """Replace every queue with the copy in ``src/queues`` (a follower joining a
        leader): close them all, swap the directories, open the copy as on a start."""
        with self._lock:
            queues = list(self._queues.values())
            self._queues = {}
            self._dropped.clear()
        for q in queues:
            q.close()
        qroot = os.path.join(self.root, "queues")
        old = os.path.join(self.root, f"{_OLD_QUEUES}{time.time_ns()}")
        fileio.rename(qroot, old)
        fileio.rename(os.path.join(src, "queues"), qroot)
        fileio.fsync_dir(self.root)
        shutil.rmtree(old, ignore_errors=True)
        with self._lock:
            self._open_queues()
        self._forget_schedules(None)
