"""A replicated server's role: candidate, leader or follower, decided by etcd.

One asyncio task on the serving loop reads the group's keys every ``poll_s`` (etcd calls
run in worker threads) and moves between roles:

- **candidate** (at start, and after every role ends): the engine refuses client writes
  (``set_role(False, None)``). If etcd names a leader, follow it; if there is none,
  campaign (``coordinator.campaign``: only a sync member, or anyone before the group
  has a sync set, can win).
- **leader** of epoch E: the replicator (``make_leader(E)``, started) is installed on
  the engine (``set_replication``), then the engine takes writes (``set_role(True)``)
  while the lease surely lives (the engine asks at each write and dequeue).
  It ends when the leader key is no longer E's, when the lease is not surely alive
  (checked every ``_WATCH_S`` apart from the etcd reads, so a leader cut off from etcd
  stops taking writes within its TTL even while an etcd call hangs), or when the
  replicator asks (``step_down``: its disk failed a queue, or a pull came from a newer
  epoch). Ending: writes are refused first, then the replicator is removed and stopped,
  then the leader key is deleted if it is still E's so a sync member takes over now
  rather than after the lease; this node then waits a TTL before it campaigns again.
- **follower** of the leader at U with epoch E: ``set_role(False, U)`` (writes answer
  a redirect to U), then the follower (``make_follower(leader)``, started; it persists
  E before contacting U and resyncs from a snapshot) pulls. It is stopped when etcd
  names another leader or epoch, or when it ended by itself; the node then goes back
  to candidate and decides again on the next read.

A leader key naming this node on another lease is left by this node's previous process:
the node waits for that lease to expire rather than follow itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from dq.server.replication.coordinator import ClusterView, Coordinator, LeaderInfo
from dq.server.replication.etcd import EtcdError

__all__ = ["FollowerRole", "LeaderRole", "Node", "RoleEngine"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How often the lease deadline is checked while leading, apart from the etcd reads.
_WATCH_S = 0.05
#: How long a candidate that could not start following waits before it tries again.
_RETRY_FOLLOW_S = 1.0


class RoleEngine(Protocol):
    """What the node needs of the engine (``dq.storage.engine.Engine``)."""

    def set_role(
        self, writable: bool, leader: str | None, alive: Callable[[], bool] | None = None
    ) -> None: ...

    def set_replication(self, sink: Any) -> None: ...

    def restore_dropped(self) -> list[str]: ...


class LeaderRole(Protocol):
    """A started replicator (``server/replication/leader.py``)."""

    async def stop(self) -> None: ...


class FollowerRole(Protocol):
    """A started follower (``server/replication/follower.py``); ``done`` once its pull
    loop has ended by itself."""

    @property
    def done(self) -> bool: ...

    def describe(self) -> dict[str, Any]:
        """Figures for ``GET /v1/cluster`` (``lsn``, ``commit_lsn``)."""
        ...

    async def stop(self) -> None: ...


class Node:
    """The role state machine of one member; ``describe()`` feeds ``GET /v1/cluster``."""

    def __init__(
        self,
        engine: RoleEngine,
        coordinator: Coordinator,
        *,
        make_leader: Callable[[int], Awaitable[LeaderRole]],
        make_follower: Callable[[LeaderInfo], Awaitable[FollowerRole]],
        on_leader: Callable[[LeaderRole | None], None] = lambda _: None,
        poll_s: float = 0.15,
    ) -> None:
        self.engine = engine
        self.coordinator = coordinator
        self.make_leader = make_leader
        self.make_follower = make_follower
        self.on_leader = on_leader
        self.poll_s = poll_s
        self.role = "candidate"
        #: the epoch led or followed (0 as candidate)
        self.epoch = 0
        self.leader: LeaderInfo | None = None
        self.replicator: LeaderRole | None = None
        self.follower: FollowerRole | None = None
        self._view: ClusterView | None = None
        self._step_down: str | None = None
        self._hold_until = 0.0
        self._retry_follow_at = 0.0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._watch: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(2, thread_name_prefix="dq-replica-node")

    @property
    def name(self) -> str:
        return self.coordinator.node

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the node's own threads: never queued behind requests
        that hold the loop's default threads while they wait for a commit."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- lifecycle --------------------------------------------------------------------

    async def start(self) -> Node:
        """Refuse writes until a role is decided, then start deciding."""
        self.engine.set_role(False, None)
        loop = asyncio.get_running_loop()

        def lease_lost() -> None:  # on the keep-alive thread
            loop.call_soon_threadsafe(self._lease_lost)

        # a lease lost and granted anew between two lease checks still ends the epoch
        self.coordinator.on_lease_lost = lease_lost
        await self.blocking(self.coordinator.start)
        self._task = asyncio.create_task(self._run(), name="dq-replica-node")
        self._watch = asyncio.create_task(self._watch_lease(), name="dq-replica-lease-watch")
        return self

    async def close(self) -> None:
        """Leave the role (resigning a leadership) and the group."""
        for task in (self._task, self._watch):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.role == "leader":
            await self._stop_leading("shutting down", hold=False)
        elif self.role == "follower":
            await self._stop_following()
        await self.blocking(self.coordinator.close)
        self._executor.shutdown(wait=False)

    def step_down(self, reason: str) -> None:
        """Ask the leader to step down (called on the event loop by the replicator)."""
        if self.role == "leader":
            self._step_down = reason
            self._wake.set()

    def describe(self) -> dict[str, Any]:
        """This member's role as ``GET /v1/cluster`` shows it. A leader whose lease is
        not surely alive (a process woken from a pause answers before its lease watch
        runs) shows as a candidate: it takes no writes and is about to step down."""
        leader, role, epoch = self.leader, self.role, self.epoch
        if role == "leader" and not self.coordinator.lease_alive():
            leader, role, epoch = None, "candidate", 0
        doc: dict[str, Any] = {
            "node": self.name,
            "role": role,
            "epoch": epoch,
            "leader": None if leader is None else {"node": leader.node, "url": leader.url},
        }
        if self.role == "follower" and self.follower is not None:
            doc.update(self.follower.describe())
        view = self._view
        if role != "leader" and view is not None and view.sync is not None:
            # the group's sync set as etcd had it at this member's last read (the
            # leader shows its own): whether this member may take over, seen from it
            doc["sync"] = list(view.sync.members)
        return doc

    # -- the loop ---------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("replica role step failed (retried)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            self._wake.clear()

    def _lease_surely_alive(self) -> bool:
        return self.coordinator.lease_alive()

    def _lease_lost(self) -> None:
        if self.role == "leader":
            self.engine.set_role(False, None)
            self.step_down("the etcd lease was lost")

    async def _watch_lease(self) -> None:
        """A leader whose lease is not surely alive stops taking writes at once."""
        while True:
            await asyncio.sleep(_WATCH_S)
            if self.role == "leader" and not self.coordinator.lease_alive():
                self.engine.set_role(False, None)
                self.step_down("the etcd lease is not surely alive")

    async def _tick(self) -> None:
        if self.role == "leader" and self._step_down is not None:
            await self._stop_leading(self._step_down)
        try:
            view = await self.blocking(self.coordinator.read)
        except EtcdError as exc:
            if self.role == "leader" and not self.coordinator.lease_alive():
                await self._stop_leading(f"etcd unreachable: {exc}")
            return
        self._view = view
        if self.role == "leader":
            if not self.coordinator.lease_alive():
                await self._stop_leading("the etcd lease is not surely alive")
            elif view.leader is None or view.leader.epoch != self.epoch:
                await self._stop_leading("the leader key is no longer this epoch's")
            return
        if self.role == "follower":
            follower = self.follower
            current = view.leader
            alive = follower is not None and not follower.done
            if alive and current is not None and current.epoch == self.epoch:
                return
            await self._stop_following()
        await self._decide(view)

    async def _decide(self, view: ClusterView) -> None:
        """As candidate: follow the leader etcd names, or campaign when there is none."""
        leader = view.leader
        if leader is not None and leader.node != self.name:
            if time.monotonic() >= self._retry_follow_at:
                await self._start_following(leader)
            return
        if leader is None and time.monotonic() < self._hold_until:
            return
        # no leader, or one naming this node: ours (a campaign whose answer was lost) or
        # our previous process's, whose lease has to expire first
        epoch = await self.blocking(self.coordinator.campaign, view)
        if epoch is not None:
            await self._start_leading(epoch)

    # -- leading ----------------------------------------------------------------------

    async def _start_leading(self, epoch: int) -> None:
        try:
            # writes in doubt from an earlier epoch of this node: memory is its log again
            await self.blocking(self.engine.restore_dropped)
            replicator = await self.make_leader(epoch)
        except Exception:
            logger.exception("could not start leading epoch %d; resigning", epoch)
            await self.blocking(self._resign, epoch)
            self._hold_until = time.monotonic() + self.coordinator.ttl_s
            return
        self.replicator = replicator
        self.role, self.epoch, self._step_down = "leader", epoch, None
        self.leader = LeaderInfo(self.name, self.coordinator.url, epoch, self.coordinator.lease)
        self.engine.set_replication(replicator)
        self.on_leader(replicator)
        # asked at every write and dequeue: a stall past the lease may end before the
        # watch below has run, and the requests waiting then must not be served
        self.engine.set_role(True, None, alive=self._lease_surely_alive)
        logger.info("%s leads epoch %d", self.name, epoch)

    async def _stop_leading(self, reason: str, hold: bool = True) -> None:
        epoch, replicator = self.epoch, self.replicator
        logger.warning("%s steps down from epoch %d: %s", self.name, epoch, reason)
        self.engine.set_role(False, None)
        self.role, self.epoch, self.leader, self.replicator = "candidate", 0, None, None
        self._step_down = None
        self.on_leader(None)
        self.engine.set_replication(None)
        if replicator is not None:
            try:
                # finishes even if a shutdown cancels this task meanwhile
                await asyncio.shield(replicator.stop())
            except Exception:
                logger.exception("stopping the replicator of epoch %d failed", epoch)
        await self.blocking(self._resign, epoch)
        if hold:  # let another sync member take over before this one tries again
            self._hold_until = time.monotonic() + self.coordinator.ttl_s

    def _resign(self, epoch: int) -> None:
        try:
            self.coordinator.resign(epoch)
        except EtcdError as exc:
            logger.warning("could not resign (the lease will expire): %s", exc)

    # -- following --------------------------------------------------------------------

    async def _start_following(self, leader: LeaderInfo) -> None:
        self.engine.set_role(False, leader.url)
        try:
            follower = await self.make_follower(leader)
        except Exception as exc:
            logger.warning("cannot follow %s (epoch %d) yet: %s", leader.node, leader.epoch, exc)
            self._retry_follow_at = time.monotonic() + _RETRY_FOLLOW_S
            return
        self.follower = follower
        self.role, self.epoch, self.leader = "follower", leader.epoch, leader
        logger.info(
            "%s follows %s at %s, epoch %d", self.name, leader.node, leader.url, leader.epoch
        )

    async def _stop_following(self) -> None:
        follower = self.follower
        self.role, self.epoch, self.leader, self.follower = "candidate", 0, None, None
        self.engine.set_role(False, None)
        if follower is not None:
            try:
                await asyncio.shield(follower.stop())
            except Exception:
                logger.exception("stopping the follower failed")
