"""The role state machine against a real etcd, with recording roles in place of the
replicator and the follower: one leader at a time, followers of its epoch, step-down on
request and on a lost lease, a sync member taking over, a previous process's key."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from dq.server.replication.coordinator import Coordinator, LeaderInfo, LeadershipLost
from dq.server.replication.etcd import EtcdClient
from dq.server.replication.node import Node
from tests.replication.etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


@dataclass
class Engine:
    """Records what the node told it."""

    writable: bool = True
    leader_url: str | None = None
    sink: Any = None
    roles: list[tuple[bool, str | None]] = field(default_factory=list)
    #: what a leader's engine asks at every write and dequeue
    alive: Callable[[], bool] | None = None
    restores: int = 0

    def set_role(
        self, writable: bool, leader: str | None, alive: Callable[[], bool] | None = None
    ) -> None:
        self.writable, self.leader_url, self.alive = writable, leader, alive
        self.roles.append((writable, leader))

    def set_replication(self, sink: Any) -> None:
        self.sink = sink

    def restore_dropped(self) -> list[str]:
        self.restores += 1
        return []


class Leading:
    """Stands for the replicator: keeps putting every live member in the sync set, as
    the real one does once a follower has caught up."""

    def __init__(self, coordinator: Coordinator, epoch: int) -> None:
        self.coordinator = coordinator
        self.epoch = epoch
        self.stopped = False
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Leading:
        self._task = asyncio.create_task(self._add_members())
        return self

    async def _add_members(self) -> None:
        while True:
            view = await asyncio.to_thread(self.coordinator.read)
            try:
                for member in view.members:
                    await asyncio.to_thread(self.coordinator.add_sync, member)
            except LeadershipLost:
                return
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class Following:
    def __init__(self, leader: LeaderInfo) -> None:
        self.leader = leader
        self.done = False
        self.stopped = False

    def describe(self) -> dict[str, Any]:
        return {"lsn": 7, "commit_lsn": 5}

    async def stop(self) -> None:
        self.stopped = True


@dataclass
class Member:
    node: Node
    engine: Engine
    coordinator: Coordinator
    followed: list[Following] = field(default_factory=list)
    led: list[Leading] = field(default_factory=list)
    refuse_to_follow: bool = False
    closed: bool = False


class Group:
    """Builds members in one cluster; ``close()`` closes every one (idempotent)."""

    def __init__(self, etcd: EtcdServer, cluster: str) -> None:
        self.etcd, self.cluster = etcd, cluster
        self.made: list[Member] = []

    async def __call__(self, name: str) -> Member:
        coordinator = Coordinator(
            EtcdClient(self.etcd.url, timeout_s=1.0),
            node=name,
            url=f"http://{name}:1",
            cluster=self.cluster,
            ttl_s=1,
            min_insync=2,
        )
        engine = Engine()
        member: Member

        async def lead(epoch: int) -> Leading:
            role = await Leading(coordinator, epoch).start()
            member.led.append(role)
            return role

        async def follow(leader: LeaderInfo) -> Following:
            if member.refuse_to_follow:
                raise RuntimeError("cannot reach the leader")
            role = Following(leader)
            member.followed.append(role)
            return role

        node = Node(engine, coordinator, make_leader=lead, make_follower=follow, poll_s=0.05)
        member = Member(node, engine, coordinator)
        await node.start()
        self.made.append(member)
        return member

    async def close(self) -> None:
        for member in self.made:
            if not member.closed:
                member.closed = True
                await member.node.close()


Scenario = Callable[[Group], Awaitable[None]]
Runner = Callable[[Scenario], None]


@pytest.fixture
def run(etcd: EtcdServer, cluster: str) -> Runner:
    def go(scenario: Scenario) -> None:
        async def main() -> None:
            group = Group(etcd, cluster)
            try:
                await scenario(group)
            finally:
                await group.close()

        asyncio.run(main())

    return go


async def until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not check():
            await asyncio.sleep(0.02)


def leaders(group: list[Member]) -> list[Member]:
    return [m for m in group if m.node.role == "leader"]


def settled(group: list[Member]) -> bool:
    lead = leaders(group)
    if len(lead) != 1:
        return False
    epoch = lead[0].node.epoch
    return all(m.node.role == "follower" and m.node.epoch == epoch for m in group if m not in lead)


def settled_in_sync(group: list[Member]) -> bool:
    """Settled, and every member in the sync set (so any of them may take over)."""
    if not settled(group):
        return False
    sync = group[0].coordinator.read().sync
    return sync is not None and {m.coordinator.node for m in group} <= set(sync.members)


def test_one_leader_the_others_follow_its_epoch(run: Runner) -> None:
    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b", "c")]
        await until(lambda: settled(group))
        (leader,) = leaders(group)
        epoch = leader.node.epoch

        def all_in_sync() -> bool:
            sync = leader.coordinator.read().sync
            return sync is not None and set(sync.members) == {"a", "b", "c"}

        await until(all_in_sync)
        assert leader.engine.writable and leader.engine.sink is leader.led[-1]
        assert leader.engine.restores == len(leader.led)  # memory made its log first
        assert leader.engine.roles[0] == (False, None)  # nothing taken before a role
        for m in group:
            if m is leader:
                continue
            assert not m.engine.writable and m.engine.leader_url == leader.coordinator.url
            assert m.followed[-1].leader.epoch == epoch
            await until(lambda m=m: len(m.node.describe().get("sync", ())) == 3)
            doc = m.node.describe()
            # a follower shows the group's sync set too: it is in it, so it may take over
            assert sorted(doc.pop("sync")) == ["a", "b", "c"]
            assert doc == {
                "node": m.coordinator.node,
                "role": "follower",
                "epoch": epoch,
                "leader": {"node": leader.coordinator.node, "url": leader.coordinator.url},
                "lsn": 7,
                "commit_lsn": 5,
            }
        assert leader.node.describe()["role"] == "leader"
        view = leader.coordinator.read()
        assert view.leader is not None and view.leader.epoch == epoch

    run(scenario)


def test_a_leader_whose_lease_may_be_gone_does_not_claim_to_lead(run: Runner) -> None:
    """A process woken from a pause longer than its lease answers ``GET /v1/cluster``
    (and any request) before its lease watch runs: it must not show itself as the
    leader, and its engine must take no write and no dequeue."""

    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b")]
        await until(lambda: settled(group))
        (leader,) = leaders(group)
        assert leader.node.describe()["role"] == "leader"
        alive = leader.engine.alive  # the engine asks it at every write and dequeue
        assert alive is not None and alive()
        leader.coordinator.lease_alive = lambda: False  # type: ignore[method-assign]
        doc = leader.node.describe()  # on the loop, before the watch can run
        assert (doc["role"], doc["epoch"], doc["leader"]) == ("candidate", 0, None)
        assert not alive()  # so the engine refuses them before the watch has run
        await until(lambda: not leader.engine.writable)  # and the watch steps it down

    run(scenario)


def test_step_down_hands_over_to_a_sync_member(run: Runner) -> None:
    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b", "c")]
        await until(lambda: settled_in_sync(group))
        (old,) = leaders(group)
        epoch = old.node.epoch
        old.node.step_down("a queue failed on its disk")
        await until(lambda: settled(group) and leaders(group)[0] is not old)
        (new,) = leaders(group)
        assert new.node.epoch > epoch
        assert old.led[-1].stopped and old.engine.sink is None and not old.engine.writable
        assert old.engine.leader_url == new.coordinator.url  # redirects to the new leader
        for m in group:
            if m is not new and m is not old:
                assert m.followed[-2].stopped  # the old epoch's follower was stopped
                assert m.followed[-1].leader.epoch == new.node.epoch

    run(scenario)


def test_lost_lease_steps_down(run: Runner, etcd: EtcdServer) -> None:
    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b")]
        await until(lambda: settled_in_sync(group))
        (old,) = leaders(group)
        epoch = old.node.epoch
        with EtcdClient(etcd.url) as admin:
            admin.lease_revoke(old.coordinator.lease)
        await until(lambda: old.node.role != "leader", timeout=5)
        assert not old.engine.writable and old.engine.sink is None
        await until(lambda: settled(group))
        assert leaders(group)[0].node.epoch > epoch

    run(scenario)


def test_leader_closing_resigns(run: Runner) -> None:
    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b", "c")]
        await until(lambda: settled_in_sync(group))
        (old,) = leaders(group)
        old.closed = True
        await old.node.close()
        assert old.led[-1].stopped
        rest = [m for m in group if m is not old]
        # the key is deleted at once: a successor within a few polls, not after the lease
        await until(lambda: settled(rest), timeout=3)

    run(scenario)


def test_a_follower_that_ended_is_restarted(run: Runner) -> None:
    async def scenario(members: Group) -> None:
        group = [await members(n) for n in ("a", "b")]
        await until(lambda: settled(group))
        follower = next(m for m in group if m.node.role == "follower")
        first = follower.followed[-1]
        first.done = True
        await until(lambda: len(follower.followed) >= 2 and follower.node.role == "follower")
        assert first.stopped and follower.followed[-1].leader.epoch == first.leader.epoch

    run(scenario)


def test_follow_failure_is_retried(run: Runner) -> None:
    async def scenario(members: Group) -> None:
        a = await members("a")
        await until(lambda: a.node.role == "leader")
        b = await members("b")
        b.refuse_to_follow = True
        await asyncio.sleep(0.5)
        assert b.node.role == "candidate" and not b.engine.writable
        assert b.engine.leader_url == a.coordinator.url  # clients are sent to the leader
        b.refuse_to_follow = False
        await until(lambda: b.node.role == "follower", timeout=5)

    run(scenario)


def test_own_key_from_a_previous_process_expires_first(
    run: Runner, etcd: EtcdServer, cluster: str
) -> None:
    async def scenario(members: Group) -> None:
        with EtcdClient(etcd.url) as admin:
            lease = admin.lease_grant(2)
            value = json.dumps({"node": "a", "url": "http://a:1"})
            admin.put(f"/dq/{cluster}/leader", value, lease.id)
        a = await members("a")
        await asyncio.sleep(0.5)
        assert a.node.role == "candidate" and not a.led and not a.followed
        await until(lambda: a.node.role == "leader", timeout=10)
        view = a.coordinator.read()
        assert view.leader is not None and view.leader.lease == a.coordinator.lease

    run(scenario)
