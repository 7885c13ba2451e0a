"""The Replicator keeping the sync set in a real etcd through the coordinator: a
caught-up follower becomes a member, a silent one leaves, never below min_insync."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from dq.server.replication.coordinator import Coordinator
from dq.server.replication.etcd import EtcdClient
from dq.server.replication.leader import Replicator, SyncSetInEtcd
from dq.storage.replication import KIND_RECORD
from tests.replication.etcd_server import EtcdServer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class NoEngine:
    def __init__(self) -> None:
        self.commits: list[int] = []
        self.lock = threading.Lock()

    def commit(self, lsn: int, sink: object = None) -> None:
        with self.lock:
            self.commits.append(lsn)


@pytest.fixture
def leader(etcd: EtcdServer, cluster: str) -> Iterator[Coordinator]:
    client = EtcdClient(etcd.url, timeout_s=1.0)
    coordinator = Coordinator(
        client, node="n1", url="http://n1:1", cluster=cluster, ttl_s=2, min_insync=2
    ).start()
    try:
        assert coordinator.campaign() is not None
        yield coordinator
    finally:
        coordinator.close()


def members(coordinator: Coordinator) -> tuple[str, ...]:
    view = coordinator.read()
    assert view.sync is not None
    return view.sync.members


def test_sync_set_follows_the_followers_in_etcd(leader: Coordinator) -> None:
    clock = Clock()

    async def go() -> None:
        rep = Replicator(
            NoEngine(),  # type: ignore[arg-type]
            node="n1",
            epoch=leader.epoch,
            coordinator=SyncSetInEtcd(leader),
            step_down=lambda reason: None,
            min_insync=2,
            replica_timeout_s=2.0,
            clock=clock,
        )
        await rep.start()
        try:
            for node in ("f1", "f2"):
                rep.attach(node)
            rep.ship("q", KIND_RECORD, b"v")
            await rep.pull("f1", leader.epoch, 1, 0)
            await rep.upkeep()
            assert members(leader) == ("n1", "f1")
            assert rep.commit_lsn == 1
            await rep.pull("f2", leader.epoch, 1, 0)
            await rep.upkeep()
            assert members(leader) == ("n1", "f1", "f2")
            clock.now += 1.0
            await rep.pull("f1", leader.epoch, 1, 0)
            clock.now += 1.5  # f2 silent for 2.5 s
            await rep.upkeep()
            assert members(leader) == ("n1", "f1")
            assert not rep.followers()["f2"].in_sync
            clock.now += 5.0  # f1 silent too: it is the last one min_insync allows
            await rep.upkeep()
            assert members(leader) == ("n1", "f1")
            assert rep.followers()["f1"].in_sync
            assert rep.status()["sync"] == ["n1", "f1"]
        finally:
            await rep.stop()

    asyncio.run(asyncio.wait_for(go(), 60))


def test_removing_a_silent_member_does_not_wait_for_a_full_default_executor(
    leader: Coordinator,
) -> None:
    """Admin calls waiting for a commit can fill the loop's default executor; the
    removal that unblocks them must not queue behind them."""
    clock = Clock()

    async def go() -> None:
        rep = Replicator(
            NoEngine(),  # type: ignore[arg-type]
            node="n1",
            epoch=leader.epoch,
            coordinator=SyncSetInEtcd(leader),
            step_down=lambda reason: None,
            min_insync=2,
            clock=clock,
        )
        await rep.start()
        release = threading.Event()
        loop = asyncio.get_running_loop()
        blockers = [loop.run_in_executor(None, release.wait, 60) for _ in range(64)]
        try:
            for node in ("f1", "f2"):
                rep.attach(node)
                await rep.pull(node, leader.epoch, 0, 0)
            await asyncio.wait_for(rep.upkeep(), 10)
            assert members(leader) == ("n1", "f1", "f2")
            clock.now += 5.0
            await rep.pull("f1", leader.epoch, 0, 0)
            await asyncio.wait_for(rep.upkeep(), 10)
            assert members(leader) == ("n1", "f1")
            await asyncio.wait_for(rep.stop(), 10)
        finally:
            release.set()
            await asyncio.gather(*blockers)
            await rep.stop()

    asyncio.run(asyncio.wait_for(go(), 120))
