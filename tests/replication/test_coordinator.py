"""Leadership, fencing and the sync set against a real etcd: campaigns racing, only
sync members campaigning, compare-and-swap conflicts, min_insync, lease loss."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dq.server.replication.coordinator import ClusterView, Coordinator, LeadershipLost
from dq.server.replication.etcd import EtcdClient
from tests.replication.etcd_server import EtcdServer, running_etcd

pytestmark = pytest.mark.integration  # a real etcd

Make = Callable[..., Coordinator]


@pytest.fixture
def make(etcd: EtcdServer, cluster: str) -> Iterator[Make]:
    made: list[Coordinator] = []

    def build(
        node: str, *, url: str | None = None, etcd_url: str | None = None, **kw: object
    ) -> Coordinator:
        client = EtcdClient(etcd_url or etcd.url, timeout_s=1.0)
        options: dict[str, object] = {"cluster": cluster, "ttl_s": 1, "min_insync": 2}
        options.update(kw)
        coordinator = Coordinator(
            client,
            node=node,
            url=url or f"http://{node}:1",
            **options,  # type: ignore[arg-type]
        ).start()
        made.append(coordinator)
        return coordinator

    yield build
    for coordinator in made:
        coordinator.close()


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "condition not met in time"
        time.sleep(0.05)


def test_campaign_epoch_is_leader_create_revision(make: Make) -> None:
    a, b = make("a"), make("b")
    epoch = a.campaign()
    assert epoch is not None and a.epoch == epoch
    view = b.read()
    assert view.leader is not None
    assert (view.leader.node, view.leader.url, view.leader.epoch) == ("a", "http://a:1", epoch)
    assert view.leader.lease == a.lease
    assert view.sync is not None and view.sync.members == ("a",) and view.sync.leader == "a"
    assert view.members == {"a": "http://a:1", "b": "http://b:1"}
    assert b.campaign() is None and b.epoch == 0
    assert a.campaign() == epoch  # asking again while leading changes nothing


def test_racing_campaigns_have_one_winner(make: Make, etcd: EtcdServer) -> None:
    nodes = [make(n) for n in ("a", "b", "c")]
    epochs: list[int] = []
    for _ in range(5):
        results: dict[str, int | None] = {}
        barrier = threading.Barrier(len(nodes))

        def run(c: Coordinator, barrier: threading.Barrier, results: dict[str, int | None]) -> None:
            barrier.wait(timeout=5)
            results[c.node] = c.campaign()

        threads = [threading.Thread(target=run, args=(c, barrier, results)) for c in nodes]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        winners = [n for n, e in results.items() if e is not None]
        assert len(winners) == 1, results
        winner = next(c for c in nodes if c.node == winners[0])
        epochs.append(winner.epoch)
        # everyone may run the next round: the winner makes all of them sync members
        for other in nodes:
            winner.add_sync(other.node)
        assert winner.resign()
    assert epochs == sorted(epochs) and len(set(epochs)) == len(epochs)


def test_only_sync_members_campaign(make: Make) -> None:
    a, b, c = make("a"), make("b"), make("c")
    first = a.campaign()
    assert first is not None
    state = a.add_sync("b")
    assert state.members == ("a", "b")
    assert a.resign()
    assert c.campaign() is None  # not in the sync set: may lack committed writes
    second = b.campaign()
    assert second is not None and second > first
    view = c.read()
    assert view.sync is not None and view.sync.members == ("b",)


def test_old_leader_is_fenced(make: Make, etcd: EtcdServer) -> None:
    a, b = make("a"), make("b")
    assert a.campaign() is not None
    a.add_sync("b")
    # a's leader key disappears as if its lease expired while it was paused
    with EtcdClient(etcd.url) as admin:
        admin.delete(a.leader_key)
    epoch_b = b.campaign()
    assert epoch_b is not None
    with pytest.raises(LeadershipLost):
        a.add_sync("c")
    with pytest.raises(LeadershipLost):
        a.remove_sync("b")
    assert a.resign() is False  # does not delete b's key
    view = b.read()
    assert view.leader is not None and view.leader.epoch == epoch_b
    assert view.sync is not None and view.sync.members == ("b",)


def test_sync_change_is_compare_and_swap(make: Make, etcd: EtcdServer) -> None:
    a = make("a", min_insync=1)
    assert a.campaign() is not None
    read = a.read
    interfered = False

    def read_then_interfere() -> ClusterView:
        nonlocal interfered
        view = read()
        if not interfered:  # another write lands between the read and the swap
            interfered = True
            with EtcdClient(etcd.url) as admin:
                admin.put(a.sync_key, json.dumps({"leader": "a", "members": ["a", "x"]}))
        return view

    a.read = read_then_interfere  # type: ignore[method-assign]
    state = a.add_sync("b")
    assert interfered
    assert state.members == ("a", "x", "b")  # the swap retried on the fresh set
    view = read()
    assert view.sync is not None and view.sync.members == ("a", "x", "b")
    assert view.sync.mod_revision == state.mod_revision


def test_remove_honours_min_insync(make: Make) -> None:
    a = make("a", min_insync=2)
    assert a.campaign() is not None
    a.add_sync("b")
    a.add_sync("c")
    assert a.add_sync("c").members == ("a", "b", "c")  # adding twice changes nothing
    removed = a.remove_sync("c")
    assert removed is not None and removed.members == ("a", "b")
    assert a.remove_sync("b") is None  # would leave 1 < min_insync
    assert a.remove_sync("a") is None  # never the leader
    assert a.remove_sync("zz") is not None  # not a member: nothing to do
    view = a.read()
    assert view.sync is not None and view.sync.members == ("a", "b")


def test_revoked_lease_steps_down(make: Make, etcd: EtcdServer) -> None:
    lost = threading.Event()
    a = make("a", on_lease_lost=lost.set)
    b = make("b")
    assert a.campaign() is not None
    a.add_sync("b")
    old_lease = a.lease
    with EtcdClient(etcd.url) as admin:
        admin.lease_revoke(old_lease)
    assert lost.wait(5), "the keep-alive did not notice the revoked lease"
    assert a.epoch == 0
    wait_until(lambda: a.lease not in (0, old_lease) and a.lease_alive())
    assert b.read().members.get("a") == "http://a:1"  # registered again on the new lease
    assert b.campaign() is not None


def test_unreachable_etcd_steps_down_within_ttl(tmp_path: Path, make: Make) -> None:
    with running_etcd(tmp_path / "own") as own:
        lost = threading.Event()
        a = make("a", etcd_url=own.url, on_lease_lost=lost.set)
        assert a.campaign() is not None
        own.pause()
        paused = time.monotonic()
        try:
            wait_until(lambda: not a.lease_alive(), timeout=5)
            # TTL 1 s counted from the last send before the pause (+ slack for a loaded machine)
            assert time.monotonic() - paused <= 2.0
            assert lost.wait(5)
        finally:
            own.resume()
        wait_until(lambda: a.lease_alive(), timeout=10)
        assert a.epoch == 0


def test_a_campaign_whose_answer_was_lost_is_adopted(make: Make) -> None:
    a, b = make("a"), make("b")
    epoch = a.campaign()
    assert epoch is not None
    a._epoch = 0  # as if the winning transaction's answer never arrived
    assert a.campaign() == epoch  # the retry finds the key on a's own lease
    assert a.epoch == epoch
    assert b.campaign() is None


def test_started_before_etcd_is_up(tmp_path: Path, cluster: str) -> None:
    later = EtcdServer(tmp_path / "later" / "data")
    (tmp_path / "later").mkdir()
    coordinator = Coordinator(
        EtcdClient(later.url, timeout_s=0.3), node="a", url="http://a:1", cluster=cluster, ttl_s=1
    ).start()  # etcd is not there yet: no lease, retried by the keep-alive thread
    try:
        assert not coordinator.lease_alive() and coordinator.campaign() is None
        later.launch()
        later.wait_up()
        wait_until(coordinator.lease_alive)
        assert coordinator.campaign() is not None
        assert coordinator.read().members == {"a": "http://a:1"}
    finally:
        coordinator.close()
        later.kill()


def test_resign_names_an_epoch_given_up_for_lost(make: Make) -> None:
    a, b = make("a"), make("b")
    epoch = a.campaign()
    assert epoch is not None
    a._epoch = 0  # as after a keep-alive whose answer never came: the lease given up
    assert a.resign() is False  # no epoch of its own any more: nothing to delete
    assert b.read().leader is not None
    assert a.resign(epoch) is True  # the key of that epoch goes now, not at lease expiry
    assert b.read().leader is None
    assert b.campaign() is None  # a is the only sync member
    assert a.campaign() is not None
