"""The nemesis: one fault at a time, every few seconds, each healed before the next.

Faults (``FAULTS``), each aimed at the node the monitor last saw leading:
  - ``kill_leader``: SIGKILL the leader's ``dq serve`` (and its compaction worker),
    restart it after a while;
  - ``partition_leader_followers``: iptables drops dq traffic between the leader and
    both followers (etcd traffic still flows: the leader keeps its lease);
  - ``partition_leader_etcd``: iptables drops etcd traffic (client and peer ports)
    between the leader's node and the others: its etcd member is cut off, its lease
    runs out, but followers and clients still reach its dq;
  - ``pause_leader``: SIGSTOP the leader past its lease TTL (and until another member
    leads, bounded), then SIGCONT: it wakes up believing it leads (the fencing test);
  - ``stall_leader``: SIGSTOP the leader for ``STALL_LEASES`` lease lengths whatever
    happens meanwhile (a long GC pause, a frozen VM): its kernel still takes the
    clients' requests, which only time out; the writes must go on at the new leader
    long before it wakes (``elected_after_s`` in the fault's record: when the monitor
    saw the new epoch; the test bounds the outage by it);
  - ``slow_network``: delay and loss on every node's link (``netns.Network.slow``);
  - ``kill_follower_merging``: SIGKILL a follower while a segment file is being
    written in its data directory (a freeze or a merge; small ``DQ_MEMSEG_BYTES``),
    then restart it.
A fault starts once every etcd member answers healthy. Each start (noted once the fault
is in place) and heal is a ``nemesis`` event in the
history; after each heal the nemesis waits (bounded) for a leader and records how long
that took (``recovered``).
"""

from __future__ import annotations

import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.jepsen.cluster import DQ_PORT, ETCD_CLIENT, ETCD_PEER, LEADER_TTL_S, Cluster, Monitor
from tests.jepsen.history import History
from tests.jepsen.netns import Network

__all__ = ["EXTRA_FAULTS", "FAULTS", "LEADER_LOSING", "STALL_LEASES", "Nemesis"]

log = logging.getLogger(__name__)

FAULTS = (
    "kill_leader",
    "partition_leader_followers",
    "partition_leader_etcd",
    "pause_leader",
    "stall_leader",
    "slow_network",
    "kill_follower_merging",
)
#: Faults after which another epoch must have begun: the leader is gone, or its lease ran
#: out (a leader whose lease is gone must not lead on, and a sync member must take over).
LEADER_LOSING = (
    "kill_leader",
    "pause_leader",
    "stall_leader",
    "partition_leader_etcd",
    "kill_all",
)
#: how many lease lengths (``LEADER_TTL_S``) ``stall_leader`` keeps the leader stopped
STALL_LEASES = 6
#: More faults for longer runs (``runner --faults``): every dq killed at once, one
#: follower cut off from the leader, the leader killed while a follower resyncs, the
#: leader's disk filled to the last byte (its writes fail: it must step down), a follower
#: SIGSTOPped, two of the three etcd members killed (no quorum: writes stop, no loss).
EXTRA_FAULTS = (
    "kill_all",
    "partition_follower",
    "kill_leader_during_resync",
    "disk_full_leader",
    "pause_follower",
    "kill_etcd_majority",
)


def _segment_in_progress(root: Path, *, merges_only: bool) -> str | None:
    """A segment file being written under ``root`` (``<lo>-<hi>.seg.tmp``; a merge when
    lo != hi, a freeze otherwise), or None."""
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if not f.endswith(".seg.tmp"):
                continue
            lo, _, hi = f[: -len(".seg.tmp")].partition("-")
            if lo != hi or not merges_only:
                return os.path.join(dirpath, f)
    return None


class Nemesis:
    def __init__(
        self,
        cluster: Cluster,
        monitor: Monitor,
        history: History,
        *,
        faults: tuple[str, ...] = FAULTS,
        hold_s: float = 3.0,
        gap_s: float = 1.0,
        rng: random.Random | None = None,
        stall_dump: bool = False,
    ) -> None:
        self.cluster = cluster
        self.net: Network = cluster.net
        self.monitor = monitor
        self.history = history
        self.faults = faults
        self.hold_s = hold_s
        self.gap_s = gap_s
        self.rng = rng or random.Random()
        self.stall_dump = stall_dump
        self.stopping = threading.Event()
        self.applied: list[dict[str, object]] = []
        #: what the fault being applied measured, added to its record in ``applied``
        self.measured: dict[str, object] = {}

    def run(self, seconds: float) -> None:
        """Faults in shuffled cycles (every kind once before any repeats) until
        ``seconds`` have passed, and at least one whole cycle; each is healed before
        the next."""
        end = time.monotonic() + seconds
        first = True
        while not self.stopping.is_set():
            order = list(self.faults)
            self.rng.shuffle(order)
            for fault in order:
                if (not first and time.monotonic() >= end) or self.stopping.is_set():
                    return
                self.apply(fault)
                self.stopping.wait(self.gap_s)
            first = False
            if time.monotonic() >= end:
                return

    def _sleep(self, seconds: float) -> None:
        self.stopping.wait(seconds)

    def apply(self, fault: str) -> None:
        self._await_etcd()
        leader = self.monitor.leader()
        if leader is None:
            try:
                leader = self.monitor.wait_leader(15)
            except TimeoutError:
                self.history.note("nemesis", fault=fault, phase="skipped", detail="no leader")
                self.applied.append({"fault": fault, "skipped": "no leader"})
                return
        action: Callable[[int], str] = getattr(self, "_" + fault)
        started, epoch_before = time.monotonic(), self.monitor.highest
        self.measured = {}
        try:
            detail = action(leader)
        finally:
            self.heal()
            self.history.note("nemesis", fault=fault, phase="healed")
        recovered = self._recovery()
        self.applied.append(
            {"fault": fault, "leader": leader, "detail": detail,
             "held_s": round(time.monotonic() - started, 1), "leader_after_s": recovered,
             "epoch_before": epoch_before, "epoch_after": self.monitor.highest,
             **self.measured}
        )  # fmt: skip
        if self.stall_dump and recovered is not None:
            self._dump_stalled_followers()

    def _await_etcd(self, timeout: float = 15.0) -> None:
        """Start a fault once every etcd member answers healthy (bounded): a fault that
        lands while etcd is still electing after the previous heal tests etcd's
        elections, not dq's failover."""
        give_up = time.monotonic() + timeout
        while not self.stopping.is_set():
            if all(self.cluster.etcd_healthy(i) for i in self.net.nodes):
                return
            if time.monotonic() > give_up:
                self.history.note("nemesis", fault="etcd", phase="unhealthy", detail=f"{timeout}s")
                return
            self.stopping.wait(0.1)

    def heal(self) -> None:
        """Undo every fault: rules and qdiscs removed, paused processes continued, dead
        dq processes started again."""
        self.net.heal()
        self.cluster.free_disks()
        for proc in self.cluster.dq.values():
            if proc.paused:
                proc.cont()
        for node, proc in self.cluster.dq.items():
            if not proc.alive():
                self.cluster.restart_dq(node)
        for proc in self.cluster.etcd.values():
            if not proc.alive():
                proc.start()

    def _recovery(self, timeout: float = 20.0) -> float | None:
        """Seconds from the heal until a member claims to lead (an answer given after
        the heal: an earlier claim may be the faulty leader's)."""
        start = time.monotonic()
        try:
            self.monitor.wait_leader(timeout, since=start)
        except TimeoutError:
            self.history.note("nemesis", fault="recovery", phase="no_leader", detail=f"{timeout}s")
            return None
        took = round(time.monotonic() - start, 2)
        self.history.note("nemesis", fault="recovery", phase="leader", detail=f"{took}s")
        return took

    def _dump_stalled_followers(self, grace_s: float = 8.0, settled_s: float = 20.0) -> None:
        """A follower that has run for ``settled_s`` yet is not in the leader's sync set
        ``grace_s`` after a heal is stuck: SIGABRT makes it write every thread's stack
        into its log (``PYTHONFAULTHANDLER``); the next heal starts it again."""
        give_up = time.monotonic() + grace_s
        while True:
            leader = self.monitor.leader()
            followers = self.monitor.doc(leader).get("followers", {}) if leader else {}
            now = time.monotonic()
            stuck = [
                n for n, proc in self.cluster.dq.items()
                if n != leader and proc.alive() and now - proc.started_at > settled_s
                and not followers.get(f"n{n}", {}).get("in_sync", False)
            ]  # fmt: skip
            if not stuck or now > give_up or leader is None:
                break
            time.sleep(0.2)
        for n in stuck if leader is not None else []:
            detail = f"n{n} not in sync {grace_s:.0f}s after the heal: {followers.get(f'n{n}')}"
            log.warning("stall: %s", detail)
            self.history.note("nemesis", fault="stall", phase="dumped", detail=detail)
            self.cluster.dq[n].signal(signal.SIGABRT)

    def _start(self, fault: str, detail: str) -> str:
        log.info("nemesis %s: %s", fault, detail)
        self.history.note("nemesis", fault=fault, phase="start", detail=detail)
        return detail

    # the faults ---------------------------------------------------------------------
    def _followers(self, leader: int) -> list[int]:
        return [i for i in self.net.nodes if i != leader]

    def _kill_leader(self, leader: int) -> str:
        self.cluster.dq[leader].kill()
        detail = self._start("kill_leader", f"SIGKILL dq n{leader}")
        self._sleep(self.hold_s / 2)
        return detail

    def _partition_leader_followers(self, leader: int) -> str:
        detail = self.net.drop(leader, self._followers(leader), ports=[DQ_PORT])
        self._start("partition_leader_followers", detail)
        self._sleep(self.hold_s)
        return detail

    def _partition_leader_etcd(self, leader: int) -> str:
        epoch, started = self.monitor.highest, time.monotonic()
        detail = self.net.drop(leader, self._followers(leader), ports=[ETCD_CLIENT, ETCD_PEER])
        self._start("partition_leader_etcd", detail)
        self._sleep(max(0.0, self.hold_s - 2 * LEADER_TTL_S - 1))
        self._hold_for_new_epoch(epoch, started)
        return detail

    def _pause_leader(self, leader: int) -> str:
        epoch, started = self.monitor.highest, time.monotonic()
        self.cluster.dq[leader].stop()
        self._start("pause_leader", f"SIGSTOP dq n{leader}")
        self._hold_for_new_epoch(epoch, started)
        return f"SIGSTOP dq n{leader} for {time.monotonic() - started:.1f}s"

    def _stall_leader(self, leader: int) -> str:
        epoch, started = self.monitor.highest, time.monotonic()
        hold_s = STALL_LEASES * LEADER_TTL_S
        self.cluster.dq[leader].stop()
        detail = self._start("stall_leader", f"SIGSTOP dq n{leader} for {hold_s}s")
        while self.monitor.highest <= epoch and time.monotonic() - started < hold_s:
            if self.stopping.wait(0.05):
                return detail
        if self.monitor.highest > epoch:
            self.measured["elected_after_s"] = round(time.monotonic() - started, 2)
        self._sleep(started + hold_s - time.monotonic())
        return detail

    def _hold_for_new_epoch(self, epoch: int, started: float, longest_s: float = 20.0) -> None:
        """Keep a leader-losing fault in place for two lease TTLs and a second, and on
        (bounded) until another member claims an epoch above ``epoch``: every etcd
        election renews every lease for a full TTL, so a lease may outlive a fixed hold
        with nothing wrong. A fault still in place after ``longest_s`` is healed and
        the check reports the leader that outlived it."""
        self._sleep(2 * LEADER_TTL_S + 1)
        while self.monitor.highest <= epoch and time.monotonic() - started < longest_s:
            if self.stopping.wait(0.05):
                return

    def _slow_network(self, leader: int) -> str:
        details = [self.net.slow(i) for i in self.net.nodes]
        detail = self._start("slow_network", "; ".join(details))
        self._sleep(self.hold_s)
        return detail

    def _kill_follower_merging(self, leader: int) -> str:
        node = self.rng.choice(self._followers(leader) or [leader])
        root = self.cluster.data_dir(node)
        start = time.monotonic()
        caught = None
        while caught is None and not self.stopping.is_set():
            waited = time.monotonic() - start
            if waited > 2 * self.hold_s:
                break
            # A merge is the target; past half the window a freeze will do.
            caught = _segment_in_progress(root, merges_only=waited < self.hold_s)
            if caught is None:
                time.sleep(0.002)
        self.cluster.dq[node].kill()
        what = f"while writing {Path(caught).name}" if caught else "(no segment write seen)"
        detail = self._start("kill_follower_merging", f"SIGKILL dq n{node} {what}")
        self._sleep(1.0)
        return detail

    def _kill_all(self, leader: int) -> str:
        for proc in self.cluster.dq.values():
            proc.kill()
        detail = self._start("kill_all", "SIGKILL every dq")
        self._sleep(1.0)
        return detail

    def _partition_follower(self, leader: int) -> str:
        node = self.rng.choice(self._followers(leader) or [leader])
        detail = self.net.drop(node, [leader], ports=[DQ_PORT])
        self._start("partition_follower", detail)
        self._sleep(self.hold_s)
        return detail

    def _kill_leader_during_resync(self, leader: int) -> str:
        """A follower restarts (every join is a full resync); the leader is killed as
        soon as the follower answers, while it is likely still copying."""
        node = self.rng.choice(self._followers(leader) or [leader])
        self.cluster.dq[node].kill()
        self.cluster.restart_dq(node)
        try:
            self.cluster.wait_dq_up(node, timeout=30)
        except (TimeoutError, RuntimeError) as exc:
            log.warning("n%d did not come back: %s", node, exc)
        self.cluster.dq[leader].kill()
        detail = self._start(
            "kill_leader_during_resync", f"n{node} restarted, SIGKILL dq n{leader}"
        )
        self._sleep(self.hold_s / 2)
        return detail

    def _disk_full_leader(self, leader: int) -> str:
        filled = self.cluster.fill_disk(leader)
        detail = self._start("disk_full_leader", f"n{leader}'s disk filled ({filled >> 20} MiB)")
        self._sleep(self.hold_s)
        return detail

    def _pause_follower(self, leader: int) -> str:
        node = self.rng.choice(self._followers(leader) or [leader])
        self.cluster.dq[node].stop()
        detail = self._start("pause_follower", f"SIGSTOP dq n{node} for {self.hold_s + 1:.0f}s")
        self._sleep(self.hold_s + 1)
        return detail

    def _kill_etcd_majority(self, leader: int) -> str:
        victims = self.rng.sample(self.net.nodes, k=len(self.net.nodes) // 2 + 1)
        for n in victims:
            self.cluster.etcd[n].kill()
        names = ",".join(f"e{n}" for n in sorted(victims))
        detail = self._start("kill_etcd_majority", f"SIGKILL etcd {names}")
        self._sleep(self.hold_s + 2)
        return detail
