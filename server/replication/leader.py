"""The leader's side of log shipping: ``Replicator``, the engine's ``ReplicationSink``.

The engine hands every record it appends to ``ship`` (under the queue's lock, from the
event loop, worker threads or the syncer); ``ship`` gives it the next lsn, appends its
encoded frame to an in-memory window and wakes pulls that wait for frames — nothing else,
so a write pays a lock, a crc and a list append. Followers pull frames over HTTP
(``server/replication/routes.py``, the wire in docs/replication.md); a pull's ``after``
acknowledges every frame up to it as fsynced on that follower.

What the replicator decides:

- ``commit_lsn``: the minimum of the acknowledgements of the followers it *counts* (the
  sync set less the leader), and only while the counted followers plus the leader reach
  ``min_insync``; with none counted and ``min_insync <= 1`` it is the last lsn shipped.
  It never goes back. The engine publishes a batch (dequeue sees it, its writer is
  answered) once its fsync is done and ``commit_lsn`` reaches its lsn: a thread of its own
  (``dq-replica-commit``) calls ``engine.commit`` whenever ``commit_lsn`` advances and
  every ``TICK_S`` regardless, so writes waiting longer than ``commit_timeout_s`` are
  answered ``ReplicationTimeout`` even when no acknowledgement comes.
- The sync set, kept in etcd by the coordinator (``server/replication/coordinator.py``):
  every member has every committed record. A follower is added once its acknowledgement
  reaches ``commit_lsn`` (so it holds everything committed so far): the replicator starts
  counting it first, then asks the coordinator to add it, so every record committed from
  the moment it is a member is on it. A member silent for ``replica_timeout_s``, or
  taking a snapshot again (its data is being replaced: it must not be able to campaign
  meanwhile), is removed the other way round: the coordinator removes it first, then the
  replicator stops waiting for it; never below ``min_insync`` (writes then wait and time
  out instead).
  A coordinator call that fails without an answer leaves the follower counted and is
  retried: counting a follower that is not a member only delays commits.
- The window: frames are kept until every attached follower has acknowledged them, and
  at most ``window_bytes`` (checked every tick); past that the laggiest follower is
  detached (its next pull is told ``resync_needed``), after leaving the sync set if it is
  a member. With no follower attached nothing is kept: one that attaches takes a
  snapshot holding everything shipped until then.

A failed queue on the leader (``local_failure``) and a pull carrying a newer epoch both
ask the node to step down through ``step_down``, called on the event loop.

Invariant: the followers counted in ``commit_lsn`` include every member of the sync set
in etcd but the leader (added to the count before etcd, removed from etcd before the
count, kept counted while etcd's answer is unknown), so whichever member etcd lets
campaign next holds every write this leader answered.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import struct
import threading
import time
import zlib
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dq.storage.replication import FRAME_HEADER

if TYPE_CHECKING:
    from dq.server.replication.coordinator import Coordinator as EtcdCoordinator
    from dq.storage import Engine

__all__ = [
    "MAX_PULL_BYTES",
    "MAX_WAIT_MS",
    "TICK_S",
    "Coordinator",
    "FollowerState",
    "Pulled",
    "Refused",
    "Replicator",
    "SyncSetInEtcd",
]

logger = logging.getLogger(__name__)

#: How often ``engine.commit`` runs without an acknowledgement (so commit timeouts fire)
#: and the sync set and the window are looked after.
TICK_S = 0.05
#: A pull answers at most about this many bytes of frames (always at least one frame).
MAX_PULL_BYTES = 4 << 20
#: The longest a pull waits for a frame.
MAX_WAIT_MS = 1000
#: The window's list drops its trimmed head in one go once the head is this long.
_COMPACT_AT = 4096


_LENGTH_CRC = struct.Struct(">II")
_AFTER_CRC = struct.Struct(">QBB")
assert _LENGTH_CRC.size + _AFTER_CRC.size == FRAME_HEADER.size


def _frame(lsn: int, name: bytes, kind: int, payload: bytes) -> bytes:
    """``encode_frame(Frame(lsn, queue, kind, payload))`` (docs/format.md, "Replication
    frames") without building a ``Frame``, the payload copied once: ship runs under a
    queue lock on every write."""
    after_crc = _AFTER_CRC.pack(lsn, kind, len(name))
    crc = zlib.crc32(payload, zlib.crc32(name, zlib.crc32(after_crc)))
    length = len(after_crc) + len(name) + len(payload)
    return b"".join((_LENGTH_CRC.pack(length, crc), after_crc, name, payload))


class Coordinator(Protocol):
    """The sync set's keeper (etcd, compare-and-swap on its revision).

    ``add_member`` answers True when ``node`` is a member afterwards (it already being one
    counts), False when it certainly is not; ``remove_member`` True when ``node`` is not a
    member afterwards, False when it certainly still is. Either raises when the outcome
    is unknown.
    """

    def add_member(self, node: str) -> Awaitable[bool]: ...

    def remove_member(self, node: str) -> Awaitable[bool]: ...


class SyncSetInEtcd:
    """``Coordinator`` over the etcd coordinator (``server/replication/coordinator.py``),
    whose calls block on HTTP: each runs on a thread of its own, never the event loop's
    default executor, where admin calls may all sit waiting for a commit that only this
    call (removing a silent member) can unblock. Its refusal to go below ``min_insync``
    answers False; a lost epoch or an etcd failure raises (unknown)."""

    def __init__(self, coordinator: EtcdCoordinator) -> None:
        self.coordinator = coordinator
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="dq-sync-set")

    async def add_member(self, node: str) -> bool:
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(self._thread, self.coordinator.add_sync, node)
        return node in state.members

    async def remove_member(self, node: str) -> bool:
        loop = asyncio.get_running_loop()
        state = await loop.run_in_executor(self._thread, self.coordinator.remove_sync, node)
        return state is not None and node not in state.members


class Refused(Exception):
    """A pull or snapshot this leader will not serve; ``code`` is the wire's error code:
    ``resync_needed``, ``stale_leader`` or ``not_leader``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class FollowerState:
    """What the leader knows of one attached follower (attached by a snapshot)."""

    node: str
    #: ``time.monotonic()`` of the snapshot that attached it
    attached_at: float
    #: highest lsn a pull acknowledged as fsynced there; -1 before its first pull
    acked: int
    #: the lsn its next pull starts after: frames above it are kept for it
    position: int
    #: ``time.monotonic()`` of its last pull or snapshot
    last_seen: float
    #: counted in ``commit_lsn``
    in_sync: bool = False
    #: in the sync set as far as the coordinator said: True, False, or None while a
    #: call's outcome is unknown (it stays counted then)
    member: bool | None = False
    #: the coordinator call to retry while ``member`` is None: "add" or "remove"
    pending: str = ""
    #: attached again by a snapshot and no pull since: its data is being replaced
    resyncing: bool = False


@dataclass(frozen=True, slots=True)
class Pulled:
    """A pull's answer: concatenated encoded frames (maybe none) and the commit lsn."""

    body: bytes
    commit_lsn: int
    epoch: int
    last_lsn: int


class Replicator:
    """One leader epoch's log shipping: lsn counter, window, acknowledgements, commit."""

    def __init__(
        self,
        engine: Engine,
        *,
        node: str,
        epoch: int,
        coordinator: Coordinator,
        step_down: Callable[[str], None],
        min_insync: int = 2,
        replica_timeout_s: float = 2.0,
        commit_timeout_s: float = 10.0,
        window_bytes: int = 256 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if min_insync < 1 or window_bytes < 1 or replica_timeout_s <= 0 or commit_timeout_s <= 0:
            raise ValueError("min_insync, window_bytes and the timeouts must be positive")
        self.engine = engine
        self.node = node
        self.epoch = epoch
        self.coordinator = coordinator
        self.min_insync = min_insync
        self.replica_timeout_s = replica_timeout_s
        #: ``ReplicationSink``: how long the engine lets a write wait for its commit
        self.commit_timeout_s = commit_timeout_s
        self.window_bytes = window_bytes
        self._step_down_cb = step_down
        self._clock = clock
        # Everything below is guarded by _lock: ship runs on any thread.
        self._lock = threading.Lock()
        self._last_lsn = 0
        self._commit_lsn = 0
        #: highest lsn dropped from the window (frames above it are held)
        self._trimmed = 0
        #: frames[i] has lsn base + i; frames[:head] are trimmed, not yet deleted
        self._frames: list[bytes] = []
        #: cum[i]: bytes shipped through frames[i] (absolute, since the epoch began)
        self._cum: list[int] = []
        self._base = 1
        self._head = 0
        self._bytes_before = 0  # absolute bytes shipped before frames[0]
        self._shipped_bytes = 0
        self._followers: dict[str, FollowerState] = {}
        #: followers with ``in_sync`` set
        self._counted = 0
        #: queue name -> its ASCII bytes, for framing
        self._names: dict[str, bytes] = {}
        self._waiters: set[asyncio.Future[None]] = set()
        self._wake_scheduled = False
        self._closed = False
        self._stepping_down = False
        self._window_warned = 0.0
        #: ``admits_writes``: the commit lsn last seen, and since when it stood still
        #: ``admits_writes``: when ``commit_lsn`` last moved, and since when frames
        #: have waited above it (set as the first of them ships)
        self._commit_moved_at = self._clock()
        self._pending_since = self._commit_moved_at
        self._loop: asyncio.AbstractEventLoop | None = None
        self._upkeep: asyncio.Task[None] | None = None
        self._commit_wanted = threading.Event()
        self._committer: threading.Thread | None = None

    # -- lifecycle (event loop) ---------------------------------------------------------

    async def start(self) -> Replicator:
        """Start the commit thread and the upkeep task; call on the serving loop."""
        self._loop = asyncio.get_running_loop()
        self._committer = threading.Thread(
            target=self._commit_forever, name="dq-replica-commit", daemon=True
        )
        self._committer.start()
        self._upkeep = asyncio.create_task(self._upkeep_forever(), name="dq-replica-upkeep")
        return self

    async def stop(self) -> None:
        """End the epoch here: waiting pulls answer ``not_leader``, the threads stop."""
        with self._lock:
            self._closed = True
            waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        if self._upkeep is not None:
            self._upkeep.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._upkeep
        self._commit_wanted.set()
        # polled, not joined in a worker thread: the default executor may be full
        give_up = time.monotonic() + 10.0
        while self._committer is not None and self._committer.is_alive():
            if time.monotonic() > give_up:
                logger.error("the replicator's commit thread did not end within 10 s")
                break
            await asyncio.sleep(0.005)

    @property
    def closed(self) -> bool:
        return self._closed

    # -- ReplicationSink (any thread, under a queue lock) -----------------------------

    def ship(self, queue: str, kind: int, payload: bytes) -> int:
        """Give the record its lsn and keep its frame for the followers. Never blocks on
        anything but this replicator's lock, never raises for a well-formed record."""
        name = self._names.get(queue)
        if name is None:
            name = self._names[queue] = queue.encode("ascii")
        with self._lock:
            if self._commit_lsn >= self._last_lsn:  # the first frame to wait from now on
                self._pending_since = self._clock()
            lsn = self._last_lsn + 1
            self._last_lsn = lsn
            if self._followers:
                frame = _frame(lsn, name, kind, payload)
                self._frames.append(frame)
                self._shipped_bytes += len(frame)
                self._cum.append(self._shipped_bytes)
            else:  # no one will ask for it: a follower that attaches starts after it
                self._trimmed = lsn
                self._base = lsn + 1
                self._head = 0
                self._bytes_before = self._shipped_bytes
                if self._frames:
                    self._frames.clear()
                    self._cum.clear()
            advanced = self.min_insync <= 1 and not self._counted
            if advanced:
                self._commit_lsn = lsn
            wake = bool(self._waiters) and not self._wake_scheduled
            if wake:
                self._wake_scheduled = True
        if advanced:
            self._commit_wanted.set()
        if wake and self._loop is not None:
            self._loop.call_soon_threadsafe(self._wake_pulls)
        return lsn

    def admits_writes(self) -> bool:
        """False once ``commit_lsn`` has stood still for a whole commit timeout while
        shipped frames wait above it (a leader cut off from its sync set, or below
        ``min_insync``): the engine then refuses new writes before writing them, so
        neither the window nor the writes waiting in memory grow without bound."""
        if self._commit_lsn >= self._last_lsn:
            return True
        # stalled: frames have waited, and the commit stood still, a whole timeout
        waited = self._clock() - max(self._commit_moved_at, self._pending_since)
        return waited < self.commit_timeout_s

    def local_failure(self, queue: str, error: BaseException) -> None:
        """A queue failed on this leader (its disk cannot be trusted): step down."""
        logger.error("queue %s failed on the leader (%s): stepping down", queue, error)
        self._ask_step_down(f"queue {queue} failed: {error}")

    # -- reads ----------------------------------------------------------------------------

    @property
    def last_lsn(self) -> int:
        return self._last_lsn

    @property
    def commit_lsn(self) -> int:
        return self._commit_lsn

    def window(self) -> tuple[int, int, int]:
        """(first lsn held, last lsn held, bytes held); first > last when empty."""
        with self._lock:
            return self._trimmed + 1, self._last_lsn, self._window_bytes_locked()

    def followers(self) -> dict[str, FollowerState]:
        """A copy of every attached follower's state."""
        with self._lock:
            return {n: dataclasses.replace(f) for n, f in self._followers.items()}

    def status(self) -> dict[str, object]:
        """``lsn``, ``commit_lsn``, ``sync`` and ``followers`` of ``GET /v1/cluster``."""
        with self._lock:
            members = sorted(n for n, f in self._followers.items() if f.member is True)
            return {
                "lsn": self._last_lsn,
                "commit_lsn": self._commit_lsn,
                "sync": [self.node, *members],
                "followers": {
                    n: {"acked": max(f.acked, 0), "in_sync": f.in_sync}
                    for n, f in sorted(self._followers.items())
                },
            }

    # -- followers (event loop) ---------------------------------------------------------

    def check_epoch(self, epoch: int) -> None:
        """A newer epoch fences this leader: step down and refuse ``stale_leader``; an
        older one means the follower must start over from a snapshot of this epoch."""
        if self._closed:
            raise Refused("not_leader", "this node no longer leads")
        if epoch > self.epoch:
            self._ask_step_down(f"a follower has seen epoch {epoch} > {self.epoch}")
            raise Refused("stale_leader", f"epoch {epoch} is newer than this leader's {self.epoch}")

    def attach(self, node: str) -> int:
        """A follower is taking a snapshot: keep every frame after the lsn returned (the
        snapshot's ``lsn``, read before the snapshot starts). A member taking one again
        is replacing its data: it leaves the sync set (as a silent one does) and is added
        again once it has pulled and caught up."""
        if self._closed:
            raise Refused("not_leader", "this node no longer leads")
        now = self._clock()
        with self._lock:
            start = self._last_lsn
            f = self._followers.get(node)
            if f is None:
                self._followers[node] = FollowerState(node, now, -1, start, now)
            else:
                f.attached_at = now
                f.position = start
                f.last_seen = now
                f.resyncing = True
        return start

    def detach_unless_counted(self, node: str, attached_at: float) -> None:
        """A snapshot that did not reach its follower releases the frames kept for it
        (unless the follower is counted, or attached again since)."""
        with self._lock:
            f = self._followers.get(node)
            if f is not None and f.attached_at == attached_at and not f.in_sync and not f.member:
                del self._followers[node]
                self._trim_locked()

    def attached_at(self, node: str) -> float | None:
        with self._lock:
            f = self._followers.get(node)
            return None if f is None else f.attached_at

    async def pull(self, node: str, epoch: int, after: int, wait_ms: int) -> Pulled:
        """Acknowledge ``after`` for ``node`` and answer the frames after it, waiting up to
        ``wait_ms`` (at most ``MAX_WAIT_MS``) when there are none yet."""
        self.check_epoch(epoch)
        if epoch < self.epoch:
            raise Refused("resync_needed", f"epoch {epoch} is older than {self.epoch}")
        advanced = self._acknowledge(node, after)
        if advanced:
            self._commit_wanted.set()
        collected = self._collect(node, after)
        if collected is None and wait_ms > 0:
            await self._wait_for_frames(after, min(wait_ms, MAX_WAIT_MS) / 1000.0)
            collected = self._collect(node, after)
        frames = collected or []
        return Pulled(b"".join(frames), self._commit_lsn, self.epoch, self._last_lsn)

    def _acknowledge(self, node: str, after: int) -> bool:
        """Record the acknowledgement; true when ``commit_lsn`` advanced."""
        now = self._clock()
        with self._lock:
            f = self._followers.get(node)
            if f is None:
                raise Refused("resync_needed", f"{node} is not attached to this leader")
            if after > self._last_lsn:
                raise Refused("resync_needed", f"lsn {after} was never shipped by this leader")
            if after < f.acked:
                logger.error(
                    "follower %s went back from lsn %d to %d: it lost acknowledged frames",
                    node,
                    f.acked,
                    after,
                )
                raise Refused("resync_needed", f"lsn {after} is below the {f.acked} acknowledged")
            if after < self._trimmed:
                raise Refused("resync_needed", f"frames after {after} are no longer held")
            f.last_seen = now
            f.acked = after
            f.resyncing = False
            moved = after > f.position
            f.position = after
            advanced = self._recompute_locked()
            if moved:
                self._trim_locked()
            return advanced

    def _collect(self, node: str, after: int) -> list[bytes] | None:
        """Frames after ``after`` (about ``MAX_PULL_BYTES``), None when there are none."""
        with self._lock:
            if self._closed:
                raise Refused("not_leader", "this node no longer leads")
            if node not in self._followers or after < self._trimmed:
                raise Refused("resync_needed", f"{node} was detached (too far behind)")
            if after >= self._last_lsn:
                return None
            i = after + 1 - self._base
            before = self._cum[i - 1] if i > 0 else self._bytes_before
            j = bisect.bisect_right(self._cum, before + MAX_PULL_BYTES, lo=i)
            return self._frames[i : max(j, i + 1)]

    async def _wait_for_frames(self, after: int, timeout: float) -> None:
        assert self._loop is not None, "start() the replicator before serving pulls"
        fut: asyncio.Future[None] = self._loop.create_future()
        with self._lock:
            if self._last_lsn > after or self._closed:
                return
            self._waiters.add(fut)
        try:
            await asyncio.wait([fut], timeout=timeout)
        finally:
            with self._lock:
                self._waiters.discard(fut)

    def _wake_pulls(self) -> None:
        with self._lock:
            self._wake_scheduled = False
            waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- commit ---------------------------------------------------------------------------

    def _recompute_locked(self) -> bool:
        """Advance ``commit_lsn`` from the counted acknowledgements; true if it moved."""
        counted = [f.acked for f in self._followers.values() if f.in_sync]
        if len(counted) + 1 < self.min_insync:
            return False
        target = min(counted) if counted else self._last_lsn
        if target > self._commit_lsn:
            self._commit_lsn = target
            self._commit_moved_at = self._clock()
            return True
        return False

    def _commit_forever(self) -> None:
        """``engine.commit`` on every advance and every tick (commit timeouts fire)."""
        while not self._closed:
            self._commit_wanted.wait(TICK_S)
            self._commit_wanted.clear()
            if self._closed:
                return
            # Only while the engine ships to this replicator: this epoch's commit lsn
            # must never publish the next epoch's records (stop() joins this thread).
            if getattr(self.engine, "replication", self) is not self:
                continue
            try:
                self.engine.commit(self._commit_lsn, self)
            except Exception:
                logger.exception("engine.commit(%d) failed", self._commit_lsn)

    # -- window ---------------------------------------------------------------------------

    def _window_bytes_locked(self) -> int:
        i = self._trimmed + 1 - self._base
        before = self._cum[i - 1] if i > 0 else self._bytes_before
        return self._shipped_bytes - before

    def _trim_locked(self) -> None:
        """Drop frames every attached follower has pulled past."""
        if self._followers:
            floor = min(f.position for f in self._followers.values())
        else:
            floor = self._last_lsn
        if floor <= self._trimmed:
            return
        self._trimmed = floor
        self._head = floor + 1 - self._base
        if self._head >= _COMPACT_AT and self._head * 2 >= len(self._frames):
            self._bytes_before = self._cum[self._head - 1]
            del self._frames[: self._head]
            del self._cum[: self._head]
            self._base += self._head
            self._head = 0

    # -- upkeep (event loop) --------------------------------------------------------------

    async def _upkeep_forever(self) -> None:
        while not self._closed:
            try:
                await self.upkeep()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("replication upkeep failed")
            await asyncio.sleep(TICK_S)

    async def upkeep(self) -> None:
        """One round: settle unknown coordinator outcomes, add caught-up followers, remove
        silent members, keep the window within its bound."""
        for node in self._nodes(lambda f: f.member is None):
            await self._settle(node)
        for node in self._nodes(self._caught_up):
            await self._add(node)
        for node in self._nodes(self._leaving):
            await self._remove(node, "silent or resyncing")
        await self._bound_window()

    def _nodes(self, pick: Callable[[FollowerState], bool]) -> list[str]:
        with self._lock:
            return [n for n, f in self._followers.items() if pick(f)]

    def _caught_up(self, f: FollowerState) -> bool:
        return (
            not f.in_sync
            and f.member is False
            and not f.resyncing
            and f.acked >= 0
            and f.acked >= self._commit_lsn
            and self._clock() - f.last_seen < self.replica_timeout_s
        )

    def _leaving(self, f: FollowerState) -> bool:
        """A member silent for the replica timeout, or replacing its data."""
        silent = self._clock() - f.last_seen >= self.replica_timeout_s
        return f.member is True and (silent or f.resyncing)

    def _removable_locked(self) -> bool:
        """Removing one counted follower keeps the sync set at ``min_insync`` at least."""
        counted = sum(1 for f in self._followers.values() if f.in_sync)
        return counted >= self.min_insync

    async def _add(self, node: str) -> None:
        with self._lock:
            f = self._followers.get(node)
            if f is None or not self._caught_up(f):
                return
            f.in_sync = True  # counted first: commits from now on wait for it
            self._counted += 1
            # it may complete min_insync: what waited for that commits now
            advanced = self._recompute_locked()
        if advanced:
            self._commit_wanted.set()
        try:
            added = await self.coordinator.add_member(node)
        except Exception as exc:
            logger.warning("adding %s to the sync set: outcome unknown (%s)", node, exc)
            self._set_member(node, None, "add")
            return
        if added:
            logger.info("%s joined the sync set", node)
            self._set_member(node, True, "")
        else:
            self._uncount(node)

    async def _remove(self, node: str, why: str) -> bool:
        """Coordinator first, then stop counting; false when it stays a member."""
        with self._lock:
            f = self._followers.get(node)
            if f is None or f.member is False:
                return True
            if not self._removable_locked():
                return False
        try:
            removed = await self.coordinator.remove_member(node)
        except Exception as exc:
            logger.warning("removing %s from the sync set: outcome unknown (%s)", node, exc)
            self._set_member(node, None, "remove")
            return False
        if removed:
            logger.warning("%s left the sync set (%s)", node, why)
            self._uncount(node)
        return removed

    async def _settle(self, node: str) -> None:
        """Retry a coordinator call whose outcome was unknown."""
        with self._lock:
            f = self._followers.get(node)
            if f is None or f.member is not None:
                return
            pending = f.pending
        if pending == "remove":
            await self._remove(node, "retried")
            return
        try:
            added = await self.coordinator.add_member(node)
        except Exception as exc:
            logger.warning("adding %s to the sync set: outcome still unknown (%s)", node, exc)
            return
        if added:
            self._set_member(node, True, "")
        else:
            self._uncount(node)

    def _set_member(self, node: str, member: bool | None, pending: str) -> None:
        with self._lock:
            f = self._followers.get(node)
            if f is not None:
                f.member = member
                f.pending = pending

    def _uncount(self, node: str) -> None:
        with self._lock:
            f = self._followers.get(node)
            if f is None:
                return
            if f.in_sync:
                self._counted -= 1
            f.in_sync = False
            f.member = False
            f.pending = ""
            advanced = self._recompute_locked()
        if advanced:
            self._commit_wanted.set()

    async def _bound_window(self) -> None:
        """Detach the laggiest followers while the window holds more than its bound."""
        for _ in range(len(self._followers) + 1):
            with self._lock:
                if self._window_bytes_locked() <= self.window_bytes or not self._followers:
                    return
                laggiest = min(self._followers.values(), key=lambda f: f.position)
                node, member = laggiest.node, laggiest.in_sync or laggiest.member is not False
            if member and not await self._remove(node, "too far behind"):
                now = self._clock()
                if now - self._window_warned > 10.0:
                    self._window_warned = now
                    logger.warning(
                        "replication window over %d bytes: %s cannot leave the sync set",
                        self.window_bytes,
                        node,
                    )
                return
            with self._lock:
                f = self._followers.get(node)
                if f is not None and not f.in_sync and f.member is False:
                    del self._followers[node]
                    logger.warning("%s detached: the replication window is full", node)
                self._trim_locked()

    # -- stepping down --------------------------------------------------------------------

    def _ask_step_down(self, reason: str) -> None:
        """Call ``step_down(reason)`` once, on the event loop, whatever thread asks."""
        with self._lock:
            if self._stepping_down:
                return
            self._stepping_down = True
        if self._loop is None:
            self._step_down_cb(reason)
            return
        try:
            self._loop.call_soon_threadsafe(self._step_down_cb, reason)
        except RuntimeError:  # the loop is closed: nothing left to step down from
            logger.warning("step down (%s) after the loop closed", reason)
