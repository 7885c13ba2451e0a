"""A replicated server's parts, wired together for the lifespan (``server/lifespan.py``).

``open_member`` builds the etcd client and the coordinator from the settings, the one
``Follower`` this server has (``follower.py``: it keeps the epoch file and its pull
thread across leaders), and the ``Node`` (``node.py``) whose roles are: a
``Replicator`` (``leader.py``) made and started for every epoch this node wins, and the
follower pointed at the leader etcd names. It publishes ``app.state.node`` (read by
``GET /v1/cluster`` and the redirects) and ``app.state.replicator`` while leading (read
by the replica routes). ``close_member`` leaves the group (resigning a leadership, so a
sync member takes over without waiting for the lease) before the engine closes.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from typing import TYPE_CHECKING, Any

from dq.server.replication.coordinator import Coordinator, LeaderInfo
from dq.server.replication.etcd import EtcdClient
from dq.server.replication.follower import Follower
from dq.server.replication.leader import Replicator, SyncSetInEtcd
from dq.server.replication.node import LeaderRole, Node

if TYPE_CHECKING:
    from dq.server.settings import Settings
    from dq.storage import Engine

__all__ = ["close_member", "leader_tls", "open_member"]


class _Following:
    """The node's follower role over the server's one ``Follower``."""

    def __init__(self, follower: Follower, node: Node) -> None:
        self.follower = follower
        self.node = node

    @property
    def done(self) -> bool:
        """The follower retries every trouble itself (back-off, resync) and a new leader
        reaches it through etcd and the node, so it ends on its own only by a bug in its
        loop (logged): then the node starts following again."""
        return not self.follower.following

    def describe(self) -> dict[str, Any]:
        status = self.follower.status()
        return {
            "lsn": status.lsn,
            "commit_lsn": status.commit_lsn or 0,
            "replica": {
                "state": status.state,
                "resyncs": status.resyncs,
                "last_error": status.last_error,
            },
        }

    async def stop(self) -> None:
        await self.node.blocking(self.follower.stop)


def leader_tls(settings: Settings) -> ssl.SSLContext | None:
    """How a follower checks an HTTPS leader: against ``DQ_REPLICA_CA`` when it is set
    (members with certificates of a private CA, or self-signed), else the system's CAs.
    A file that cannot be read stops the server at start, not at the first failover."""
    if not settings.replica_ca:
        return None
    return ssl.create_default_context(cafile=settings.replica_ca)


async def open_member(state: Any, engine: Engine, settings: Settings) -> Node:
    """Join the replica group ``settings`` names; ``state`` is ``app.state``."""
    # an etcd call never outlasts half the lease, so a leader sees trouble in time
    client = EtcdClient(settings.etcd, timeout_s=min(1.0, settings.leader_ttl_s / 2))
    coordinator = Coordinator(
        client,
        node=settings.node_name,
        url=settings.public_url,
        cluster=settings.cluster,
        ttl_s=settings.leader_ttl_s,
        min_insync=settings.min_insync,
    )
    follower = await asyncio.to_thread(
        Follower,
        engine,
        settings.data_dir,
        settings.node_name,
        token=settings.tokens[0] if settings.tokens else None,
        ssl_context=leader_tls(settings),
    )
    sync_set = SyncSetInEtcd(coordinator)
    node: Node

    async def make_leader(epoch: int) -> Replicator:
        replicator = Replicator(
            engine,
            node=settings.node_name,
            epoch=epoch,
            coordinator=sync_set,
            step_down=node.step_down,
            min_insync=settings.min_insync,
            replica_timeout_s=settings.replica_timeout_ms / 1000.0,
            commit_timeout_s=settings.commit_timeout_ms / 1000.0,
            window_bytes=settings.replica_window_bytes,
        )
        return await replicator.start()

    async def make_follower(leader: LeaderInfo) -> _Following:
        await node.blocking(
            functools.partial(follower.follow, leader_node=leader.node), leader.url, leader.epoch
        )
        return _Following(follower, node)

    def on_leader(replicator: LeaderRole | None) -> None:
        state.replicator = replicator

    node = Node(
        engine,
        coordinator,
        make_leader=make_leader,
        make_follower=make_follower,
        on_leader=on_leader,
    )
    state.replicator = None
    state.node = node
    await node.start()
    return node


async def close_member(state: Any, node: Node) -> None:
    await node.close()
    state.node = None
    state.replicator = None
