"""A follower counts a queue's items as its leader does once it has applied the same
records: pending, due, delayed and the oldest due item's age, through enqueues,
releases, requeues, operator deletes, freezes and merges on either side.

A follower keeps the tombstones of released items in its in-memory segment (it has no
cursor to put them behind); each must cancel the entry it names in the counts too.

In process: the leader is the real server with a ``Replicator``, the follower the
server's ``Follower`` over a real engine (``test_follow_apply.py``'s helpers), so freezes
and merges happen when the test says. End to end: three ``dq serve`` members and etcd,
read through each member's HTTP API and ``/metrics``, with logs small enough that each
member freezes and merges on its own. Leases are all ended before each comparison: a
follower knows of none (dequeue writes nothing).

Each member cuts its own logs (``docs/replication.md``: followers freeze and merge their
own logs), so where a release's tombstone lands beside its item's pending entry is the
member's own: in the same log the pair cancels when the log is frozen and leaves nothing
to merge (a follower whose compaction worker lags keeps appending to its log up to
twice its limit, as a single node past ``max_frozen`` does, and may cancel most pairs
so). The end-to-end test
therefore releases its last items only once every member holds them in segment files:
their tombstones then land in a newer log on every member, and the garbage they make
outweighs what is live there, which the merge policy promises to merge
(``docs/merging.md``).
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from dq.client import Client
from dq.client import NewItem as ClientItem
from dq.client import Requeue as ClientRequeue
from dq.storage import Engine, NewItem, Release, Requeue
from tests.replication.cluster import QUEUE, Cluster, eventually
from tests.replication.test_follow_apply import (
    Leader,
    caught_up,
    following,
    leading,
    wait_for,
)
from tests.server.live import LiveServer

# integration: in-process servers on 127.0.0.1, dq serve members, etcd
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

MINUTE = 60_000
HOUR = 60 * MINUTE
VALUE = b"v" * 700  # ~90 to a segment file's block


def figures(engine: Engine, queue: str) -> tuple[int, int, int, int]:
    s = engine.stats(queue)
    return s.pending, s.due, s.delayed, s.leased


def assert_same_counts(leader: Leader, follower: Engine, queue: str) -> None:
    """The follower's figures are the leader's (its oldest due age read a little later)."""
    wait_for(lambda: caught_up(leader, "f1"), what="the follower to apply every record")
    t0 = time.monotonic()
    mine = leader.engine.stats(queue)
    theirs = follower.stats(queue)
    between_ms = (time.monotonic() - t0) * 1000
    assert figures(follower, queue) == figures(leader.engine, queue)
    assert (theirs.pending, theirs.due, theirs.delayed, theirs.leased) == (
        mine.pending,
        mine.due,
        mine.delayed,
        mine.leased,
    )
    if mine.oldest_due_age_ms is None:
        assert theirs.oldest_due_age_ms is None
    else:
        assert theirs.oldest_due_age_ms is not None
        lag = theirs.oldest_due_age_ms - mine.oldest_due_age_ms
        assert 0 <= lag <= between_ms + 2, (mine.oldest_due_age_ms, theirs.oldest_due_age_ms)


def test_a_released_item_is_not_due_on_the_follower(tmp_path: Path) -> None:
    """A delayed a minute, B due now; B leased and released: pending 1, due 0,
    delayed 1 and nothing due on the leader and on the follower."""
    with leading(tmp_path, min_insync=2) as leader, following(leader, tmp_path / "f1") as f:
        wait_for(lambda: "f1" in leader.sync.members, what="f1 in the sync set")
        e = leader.engine
        e.enqueue("q", [NewItem(b"A", delay_ms=MINUTE), NewItem(b"B")])
        (b,) = e.dequeue("q", 1, lease_ms=30_000)
        assert b.value == b"B"
        e.release("q", [Release(b.id, b.receipt)])
        assert figures(e, "q") == (1, 0, 1, 0)
        assert_same_counts(leader, f.engine, "q")
        assert f.engine.stats("q").oldest_due_age_ms is None
        # and so once the follower's log (the tombstone beside its entry) is a segment file
        f.engine.freeze("q")
        assert_same_counts(leader, f.engine, "q")


def test_counts_agree_through_releases_requeues_deletes_and_merges(tmp_path: Path) -> None:
    with leading(tmp_path, min_insync=2) as leader, following(leader, tmp_path / "f1") as f:
        wait_for(lambda: "f1" in leader.sync.members, what="f1 in the sync set")
        e, rng = leader.engine, random.Random(3)
        for phase in range(6):
            now = int(time.time() * 1000)
            e.enqueue(
                "q",
                [
                    NewItem(
                        VALUE, deadline=now + rng.choice([-1, 1]) * rng.randint(MINUTE, 30 * MINUTE)
                    )
                    for _ in range(300)
                ],
            )
            got = e.dequeue("q", 120, lease_ms=60_000)
            rng.shuffle(got)
            e.release("q", [Release(d.id, d.receipt) for d in got[:60]])
            e.requeue("q", [Requeue(d.id, d.receipt, delay_ms=20 * MINUTE) for d in got[60:90]])
            e.requeue("q", [Requeue(d.id, d.receipt, delay_ms=0) for d in got[90:]])
            for item in e.browse("q", "delayed", None, limit=3).items:
                e.delete_item("q", item.id)
            if phase % 2 == 0:
                e.freeze("q")
            if phase % 3 == 1:
                f.engine.freeze("q")
            assert_same_counts(leader, f.engine, "q")
        for engine in (e, f.engine):
            q = engine.queue("q")
            assert len(q.segments) >= 2
            q.merge(1, len(q.segments))  # not from the oldest: rogue tombstones stay
        assert_same_counts(leader, f.engine, "q")
        e.queue("q").merge(0, len(e.queue("q").segments))
        assert_same_counts(leader, f.engine, "q")
        pending, due, delayed, leased = figures(f.engine, "q")
        assert (pending, leased) == (6 * (300 - 60 - 3), 0) and due > 0 and delayed > 0


# -- end to end: three ``dq serve`` members --------------------------------------------


@pytest.fixture
def group_env() -> dict[str, str]:
    """The members' logs freeze at 64 KiB, so segment files and merges come soon."""
    return {"DQ_MEMSEG_BYTES": str(64 << 10)}


def member_figures(server: LiveServer) -> dict[str, Any]:
    """What the member's API and its /metrics say of the queue."""
    stats = httpx.get(f"{server.url}/v1/queues/{QUEUE}", timeout=5).json()["stats"]
    text = httpx.get(f"{server.url}/metrics", timeout=5).text
    gauges = {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("queue") == QUEUE
    }
    return {
        "api": tuple(stats[n] for n in ("pending", "due", "delayed", "leased")),
        "metrics": tuple(
            int(gauges[f"dq_queue_{n}"]) for n in ("pending", "due", "delayed", "leased")
        ),
        "oldest_due_age_ms": stats["oldest_due_age_ms"],
        "segment_files": sorted(p.name for p in (server.data_dir / "queues" / QUEUE).glob("*.seg")),
    }


def applied_everything(group: Cluster, leader: str) -> bool | None:
    lsn = group.describe(leader)["lsn"]
    return True if all(group.describe(n)["lsn"] == lsn for n in group.servers) else None


def all_in_segment_files(group: Cluster) -> bool | None:
    """Every member's queue has no entry in memory: its logs are frozen into segment
    files (the member's own ``stats.extra``)."""
    for server in group.servers.values():
        extra = httpx.get(f"{server.url}/v1/queues/{QUEUE}", timeout=5).json()["stats"]["extra"]
        if extra["memseg_entries"] or extra["frozen"]:
            return None
    return True


def test_members_of_a_replica_group_give_the_same_counts(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    lead = view.leader.node
    with Client(view.leader.url) as dq:
        dq.enqueue(QUEUE, b"A", delay_ms=MINUTE)
        dq.enqueue(QUEUE, b"B")
        (b,) = dq.dequeue(QUEUE, count=1, lease_ms=30_000)
        dq.release(QUEUE, b.id, b.receipt)
        eventually("every member to apply every record", lambda: applied_everything(group, lead))
        for name, server in group.servers.items():
            seen = member_figures(server)
            assert seen["api"] == seen["metrics"] == (1, 0, 1, 0), name
            assert seen["oldest_due_age_ms"] is None, name

        # writes enough for every member to freeze logs (and merge, where a release came
        # in a newer log than its item: that depends on each member's own log boundaries)
        rng = random.Random(9)
        released = 0
        for _ in range(12):
            now = int(time.time() * 1000)
            dq.enqueue_many(
                QUEUE,
                [
                    ClientItem(
                        rng.randbytes(700),
                        deadline=now + rng.choice([-1, -1, 1]) * rng.randint(MINUTE, HOUR),
                    )
                    for _ in range(100)
                ],
            )
            got = dq.dequeue(QUEUE, count=100, lease_ms=60_000)
            dq.release_many(QUEUE, got[:-15])
            released += len(got[:-15])
            dq.requeue_many(
                QUEUE,
                [ClientRequeue(g.id, g.receipt, delay_ms=rng.choice([0, HOUR])) for g in got[-15:]],
            )
        eventually("every member to apply every record", lambda: applied_everything(group, lead))

        # garbage no member can cancel at a freeze: a backlog of due items, released only
        # once every member has frozen it, outweighs what is live (~500 items) on every
        # member whatever its log boundaries, so each one merges (``docs/merging.md``)
        backlog = 10 * 100
        for _ in range(backlog // 100):
            now = int(time.time() * 1000)
            dq.enqueue_many(
                QUEUE,
                [
                    ClientItem(rng.randbytes(700), deadline=now - rng.randint(0, MINUTE))
                    for _ in range(100)
                ],
            )
        # a batch fills a 64 KiB log alone, so each member's last log is closed after it
        eventually("every member to apply every record", lambda: applied_everything(group, lead))
        eventually("every member to freeze the backlog", lambda: all_in_segment_files(group), 60)
        # the last log each member has frozen: the releases' tombstones come in later ones
        frozen = {
            n: max(int(f[11:21]) for f in member_figures(s)["segment_files"])
            for n, s in group.servers.items()
        }
        kept = []
        for _ in range(backlog):  # every due item, each call takes up to 100
            got = dq.dequeue(QUEUE, count=100, lease_ms=60_000)
            if not got:
                break
            dq.release_many(QUEUE, got[:-1])
            released += len(got[:-1])
            kept.append(got[-1])
        # due again: an oldest due age to compare
        dq.requeue_many(QUEUE, [ClientRequeue(g.id, g.receipt, delay_ms=0) for g in kept])
        eventually("every member to apply every record", lambda: applied_everything(group, lead))

        def merged_everywhere() -> bool | None:
            """Each member has merged segment files that take in a log of the releases."""
            files = {n: member_figures(s)["segment_files"] for n, s in group.servers.items()}
            merged = [
                [f for f in names if f[:10] != f[11:21] and int(f[11:21]) > frozen[n]]
                for n, names in files.items()
            ]
            return True if all(merged) else None

        eventually("a merge of the released backlog on every member", merged_everywhere, 120)
        seen = {name: member_figures(server) for name, server in group.servers.items()}
        leader_seen = seen[lead]
        assert leader_seen["api"][0] == 1 + 12 * 100 + backlog - released
        assert leader_seen["api"][3] == 0
        for name, figures_ in seen.items():
            assert figures_["api"] == figures_["metrics"] == leader_seen["api"], (name, seen)
            age, lead_age = figures_["oldest_due_age_ms"], leader_seen["oldest_due_age_ms"]
            assert lead_age is not None and age is not None and abs(age - lead_age) < 5_000
