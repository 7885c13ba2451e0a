"""Leadership, epochs and the sync set of one replica group, kept in etcd.

Keys, under ``/dq/<cluster>/`` (docs/replication.md):

- ``leader``: ``{"node", "url"}`` on the leader's lease. Its ``create_revision`` is the
  **epoch**: a number no other leadership will ever have, which fences every message of
  an older leader (followers persist the highest epoch they have seen and refuse less).
- ``sync``: ``{"leader", "members"}``, the members that have every committed write. It
  changes only by a transaction comparing its ``mod_revision`` and that the leader key
  is still the one of the writer's epoch, so a leader that lost its key (paused past
  its lease, cut off from etcd) can never change it again.
- ``members/<node>``: ``{"url"}`` on each member's own lease (discovery, status).

Rules kept here:

- Campaign: one transaction that succeeds only if there is no leader key and the sync
  key is absent or unchanged since it was read with this node in it, so only a member
  that has every committed write can become leader. It writes the leader key on this
  node's lease and a sync set of just this node. A campaign whose answer was lost and
  whose retry found a leader key on this node's own lease won (the first try did).
- Sync changes never take the set below ``min_insync`` members; the caller adds a
  follower only once it has acknowledged everything shipped, and stops waiting for one
  only after its removal has committed here.
- The lease is renewed every TTL/3. When a renewal finds it gone, or no renewal has
  succeeded for a TTL counted from when the last good one was sent (etcd counts from
  when it received it, so this side gives up first), the lease is lost: the epoch is
  over, ``on_lease_lost`` runs and a new lease is granted when etcd answers again.
- Resign deletes the leader key only while its create_revision is still this epoch.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from dq.server.replication.etcd import (
    EtcdClient,
    EtcdError,
    KeyValue,
    compare_create,
    compare_mod,
    compare_version,
    delete_op,
    put_op,
    range_op,
)

__all__ = ["ClusterView", "Coordinator", "LeaderInfo", "LeadershipLost", "SyncState"]

logger = logging.getLogger(__name__)

#: Attempts of a sync-set change that keeps losing its compare-and-swap to another
#: change of this same leader (never to another leader: that ends the epoch).
_CAS_ATTEMPTS = 8


class LeadershipLost(Exception):
    """This node's epoch is over: its leader key is gone or belongs to another epoch."""


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    node: str
    url: str
    #: the leader key's create_revision
    epoch: int
    lease: int


@dataclass(frozen=True, slots=True)
class SyncState:
    leader: str
    members: tuple[str, ...]
    #: the sync key's mod_revision: what a change compares against
    mod_revision: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The group's keys, read in one transaction (one revision of the store)."""

    revision: int
    leader: LeaderInfo | None
    sync: SyncState | None
    #: node → url of every member whose lease is alive
    members: dict[str, str]


def _leader(kv: KeyValue | None) -> LeaderInfo | None:
    if kv is None:
        return None
    data = kv.json()
    return LeaderInfo(str(data["node"]), str(data["url"]), kv.create_revision, kv.lease)


def _sync(kv: KeyValue | None) -> SyncState | None:
    if kv is None:
        return None
    data = kv.json()
    return SyncState(str(data["leader"]), tuple(data["members"]), kv.mod_revision)


class Coordinator:
    """One node's view and actions on its replica group's keys.

    ``start()`` grants the lease, registers the member and starts the keep-alive
    thread; ``close()`` stops it, resigns, and revokes the lease.
    """

    def __init__(
        self,
        client: EtcdClient,
        *,
        node: str,
        url: str,
        cluster: str = "dq",
        ttl_s: int = 2,
        min_insync: int = 2,
        on_lease_lost: Callable[[], None] | None = None,
    ) -> None:
        if not node or "/" in node:
            raise ValueError(f"a member name is non-empty without '/': {node!r}")
        if min_insync < 1 or ttl_s < 1:
            raise ValueError("min_insync and ttl_s must be at least 1")
        self.client = client
        self.node = node
        self.url = url
        self.prefix = f"/dq/{cluster}/"
        self.ttl_s = ttl_s
        self.min_insync = min_insync
        self.on_lease_lost = on_lease_lost
        self._lock = threading.Lock()
        self._lease = 0
        #: monotonic time until which the lease surely lives (0: no lease)
        self._lease_until = 0.0
        self._epoch = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- keys -------------------------------------------------------------------------

    @property
    def leader_key(self) -> str:
        return self.prefix + "leader"

    @property
    def sync_key(self) -> str:
        return self.prefix + "sync"

    def member_key(self, node: str) -> str:
        return f"{self.prefix}members/{node}"

    # -- lease ------------------------------------------------------------------------

    @property
    def lease(self) -> int:
        return self._lease

    @property
    def epoch(self) -> int:
        """This node's epoch while it leads (0 otherwise)."""
        return self._epoch

    def lease_alive(self) -> bool:
        """True while the lease surely lives (a leader must step down once it is not)."""
        with self._lock:
            return self._lease != 0 and time.monotonic() < self._lease_until

    def start(self) -> Coordinator:
        """Grant the lease and register (retried by the keep-alive thread if etcd is
        down now), then keep the lease alive in a daemon thread."""
        try:
            self._new_lease()
        except EtcdError as exc:
            logger.warning("etcd not reachable yet: %s", exc)
        self._thread = threading.Thread(target=self._keepalive_forever, name="dq-etcd-lease")
        self._thread.daemon = True
        self._thread.start()
        return self

    def _new_lease(self) -> None:
        sent = time.monotonic()
        lease = self.client.lease_grant(self.ttl_s)
        with self._lock:
            self._lease = lease.id
            self._lease_until = sent + lease.ttl
        self.client.put(self.member_key(self.node), json.dumps({"url": self.url}), lease.id)
        logger.info("etcd lease %x granted (ttl %d s), member %s", lease.id, lease.ttl, self.node)

    def _keepalive_forever(self) -> None:
        interval = self.ttl_s / 3.0
        while not self._stop.wait(interval):
            try:
                if self._lease == 0:
                    self._new_lease()
                    continue
                sent = time.monotonic()
                ttl = self.client.lease_keepalive(self._lease)
            except EtcdError as exc:
                logger.warning("etcd lease keep-alive failed: %s", exc)
                if self._lease and not self.lease_alive():
                    self._lose_lease("no keep-alive answered for a TTL")
                continue
            if ttl <= 0:
                self._lose_lease("etcd says it expired")
                continue
            with self._lock:
                self._lease_until = sent + ttl

    def _lose_lease(self, why: str) -> None:
        with self._lock:
            lost, epoch = self._lease, self._epoch
            self._lease, self._lease_until, self._epoch = 0, 0.0, 0
        if epoch:
            logger.warning("etcd lease %x lost (%s): epoch %d is over", lost, why, epoch)
        else:
            logger.warning("etcd lease %x lost (%s)", lost, why)
        if self.on_lease_lost is not None:
            try:
                self.on_lease_lost()
            except Exception:
                logger.exception("the lease-lost callback failed")

    def close(self) -> None:
        """Stop renewing, resign if leading, revoke the lease (its keys go with it)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.client.timeout_s * len(self.client.endpoints) + 1)
        try:
            self.resign()
            if self._lease:
                self.client.lease_revoke(self._lease)
        except EtcdError as exc:
            logger.warning("etcd unreachable while leaving (the lease will expire): %s", exc)
        with self._lock:
            self._lease, self._lease_until, self._epoch = 0, 0.0, 0
        self.client.close()

    # -- reading ----------------------------------------------------------------------

    def read(self) -> ClusterView:
        """The leader, the sync set and the live members, as of one revision."""
        result = self.client.txn(
            [],
            [
                range_op(self.leader_key),
                range_op(self.sync_key),
                range_op(self.prefix + "members/", prefix=True),
            ],
        )
        leader, sync, members = result.ranges
        urls = {}
        for kv in members.kvs:
            urls[kv.key.rsplit("/", 1)[1]] = str(kv.json().get("url", ""))
        return ClusterView(result.revision, _leader(leader.first()), _sync(sync.first()), urls)

    # -- leadership -------------------------------------------------------------------

    def campaign(self, view: ClusterView | None = None) -> int | None:
        """Try to become leader; returns the epoch if this node won, None otherwise
        (a leader exists, this node is not in the sync set, or another won the race)."""
        lease = self._lease
        if not lease or not self.lease_alive():
            return None
        view = view or self.read()
        if view.leader is not None:
            return self._adopt(view.leader, lease)
        if view.sync is not None and self.node not in view.sync.members:
            return None
        sync_compare = (
            compare_version(self.sync_key, 0)
            if view.sync is None
            else compare_mod(self.sync_key, view.sync.mod_revision)
        )
        me = json.dumps({"node": self.node, "url": self.url})
        sync = json.dumps({"leader": self.node, "members": [self.node]})
        result = self.client.txn(
            [compare_create(self.leader_key, 0), sync_compare],
            [put_op(self.leader_key, me, lease), put_op(self.sync_key, sync)],
            [range_op(self.leader_key)],
        )
        if result.succeeded:
            with self._lock:
                self._epoch = result.revision
            logger.info("%s leads, epoch %d", self.node, result.revision)
            return result.revision
        return self._adopt(_leader(result.ranges[0].first()), lease)

    def _adopt(self, leader: LeaderInfo | None, lease: int) -> int | None:
        """A leader key on this node's own lease was written by this node's campaign
        (an earlier try whose answer was lost): that campaign won."""
        if leader is None or leader.lease != lease or leader.node != self.node:
            return None
        with self._lock:
            self._epoch = leader.epoch
        return leader.epoch

    def resign(self, epoch: int = 0) -> bool:
        """Give up leadership of ``epoch`` (default: the one this node leads; only ever
        an epoch this node won), deleting
        the leader key only while it is still that epoch's. The sync set stays, so a
        sync member takes over. An epoch whose lease this node has given up for lost may
        still have its key (etcd had the renewal whose answer never came): naming it
        here deletes the key instead of waiting for that lease to expire."""
        epoch = epoch or self._epoch
        if not epoch:
            return False
        with self._lock:
            if self._epoch == epoch:
                self._epoch = 0
        result = self.client.txn(
            [compare_create(self.leader_key, epoch)], [delete_op(self.leader_key)]
        )
        logger.info("%s resigned epoch %d (key deleted: %s)", self.node, epoch, result.succeeded)
        return result.succeeded

    # -- the sync set -----------------------------------------------------------------

    def add_sync(self, node: str) -> SyncState:
        """Add ``node`` to the sync set (it has acknowledged everything shipped)."""
        return self._change_sync(
            lambda members: (*members, node) if node not in members else members
        )

    def remove_sync(self, node: str) -> SyncState | None:
        """Remove ``node`` from the sync set; None (nothing changed) if that would leave
        fewer than ``min_insync`` members or would remove the leader."""
        if node == self.node:
            return None
        refused = False

        def without(members: tuple[str, ...]) -> tuple[str, ...]:
            nonlocal refused
            kept = tuple(m for m in members if m != node)
            refused = len(kept) < self.min_insync and kept != members
            return members if refused else kept

        state = self._change_sync(without)
        return None if refused else state

    def _change_sync(self, change: Callable[[tuple[str, ...]], tuple[str, ...]]) -> SyncState:
        """Compare-and-swap the sync set while this node's epoch holds; raises
        ``LeadershipLost`` when it does not."""
        for _ in range(_CAS_ATTEMPTS):
            epoch = self._epoch
            if not epoch:
                raise LeadershipLost(f"{self.node} does not lead")
            view = self.read()
            if view.leader is None or view.leader.epoch != epoch:
                raise LeadershipLost(f"{self.node}'s epoch {epoch} is over")
            current = view.sync or SyncState(self.node, (self.node,), 0)
            members = change(current.members)
            if members == current.members:
                return current
            value = json.dumps({"leader": self.node, "members": list(members)})
            result = self.client.txn(
                [
                    compare_create(self.leader_key, epoch),
                    compare_mod(self.sync_key, current.mod_revision),
                ],
                [put_op(self.sync_key, value)],
            )
            if result.succeeded:
                logger.info("sync set of epoch %d: %s", epoch, ", ".join(members))
                return SyncState(self.node, members, result.revision)
        raise EtcdError(self.sync_key, f"sync set kept changing under {_CAS_ATTEMPTS} attempts")
