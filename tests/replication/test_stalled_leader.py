"""A leader stalled (``SIGSTOP``) for many lease lengths while producers keep writing
through clients given every member: writes go on at the new leader a few seconds after
its election, however long the stall lasts, and nothing acknowledged is lost.

One etcd and three ``dq serve`` (the cluster of ``cluster.py``, leases of 1 s). A
stopped process's kernel still accepts connections and requests, so the clients meet
no refusal and no refused connection: only timeouts. Producers: ``Client`` without
keys, ``Client`` with keys (a timed-out keyed enqueue is resent to the new leader),
``AsyncClient``, and a ``dq put`` run (a new process: it knows nothing of the stall).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import threading
import time

import pytest

from dq.client import AsyncClient, Client, ClientError
from tests.replication.cluster import QUEUE, Cluster, eventually, leader_other_than
from tests.server.live import REPO
from tests.stopped import sigstop

# integration: three dq serve members, etcd, the dq CLI
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: how long the leader stays stopped: 12 of its 1 s leases
STALL_S = 12.0
#: the clients' timeout per request, as an application would set it
TIMEOUT_S = 5.0
#: the longest time without an acknowledged write allowed after the election: the
#: requests sent to the stalled leader before it was replaced time out after
#: TIMEOUT_S, then the next go to the new leader (a little room for a loaded machine)
AFTER_ELECTION_S = TIMEOUT_S + 2.0


class Writes:
    """What the producers did: acknowledged values with when, and unknown outcomes."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[bytes, float] = {}
        #: producer → what its calls with an unknown outcome raised
        self.unknown: dict[str, list[str]] = {}
        self.unknown_values: set[bytes] = set()
        self.stop = threading.Event()

    def ack(self, value: bytes) -> None:
        with self.lock:
            self.acked[value] = time.monotonic()

    def lost(self, who: str, value: bytes, exc: BaseException) -> None:
        with self.lock:
            self.unknown.setdefault(who, []).append(f"{value!r}: {exc}")
            self.unknown_values.add(value)

    def count(self) -> int:
        with self.lock:
            return len(self.acked)

    def times(self) -> list[float]:
        with self.lock:
            return sorted(self.acked.values())


def produce(writes: Writes, urls: list[str], who: str, keyed: bool) -> None:
    with Client(urls, timeout=TIMEOUT_S) as dq:
        n = 0
        while not writes.stop.is_set():
            value = f"{who}-{n}".encode()
            n += 1
            try:
                dq.enqueue(QUEUE, value, key=value.decode() if keyed else None)
            except ClientError as exc:
                writes.lost(who, value, exc)
                continue
            writes.ack(value)


def produce_async(writes: Writes, urls: list[str]) -> None:
    async def run() -> None:
        async with AsyncClient(urls, timeout=TIMEOUT_S) as dq:
            n = 0
            while not writes.stop.is_set():
                value = f"async-{n}".encode()
                n += 1
                try:
                    await dq.enqueue(QUEUE, value)
                except ClientError as exc:
                    writes.lost("async", value, exc)
                    continue
                writes.ack(value)

    asyncio.run(run())


def longest_gap(times: list[float], start: float, end: float) -> tuple[float, float]:
    """The longest time between acknowledgements within ``[start, end]`` (the edges
    count as acknowledgements), and when it began."""
    inside = [start, *(t for t in times if start < t < end), end]
    gaps = [(b - a, a) for a, b in itertools.pairwise(inside)]
    return max(gaps)


def test_a_leader_stalled_for_many_leases_stops_writes_for_one_timeout(group: Cluster) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None
    first = view.leader
    stalled = group.servers[first.node]
    assert stalled.proc is not None
    # the leader first: every producer is writing to it when it stops
    urls = [first.url] + [s.url for n, s in group.servers.items() if n != first.node]
    writes = Writes()
    producers = [
        threading.Thread(target=produce, args=(writes, urls, "plain", False)),
        threading.Thread(target=produce, args=(writes, urls, "keyed", True)),
        threading.Thread(target=produce_async, args=(writes, urls)),
    ]
    for p in producers:
        p.start()
    cli: subprocess.CompletedProcess[str] | None = None
    try:
        eventually("writes before the stall", lambda: True if writes.count() >= 150 else None)
        sigstop(stalled.proc.pid)
        stopped_at = time.monotonic()
        try:
            successor = eventually(
                "a new leader while the old one is stopped", leader_other_than(group, first.node)
            )
            elected_at = time.monotonic()
            assert successor.epoch > first.epoch
            # a new process (the CLI) knows nothing of the stall and is given the
            # stopped node first: it asks it who leads (2 s at most), then goes on
            t0 = time.monotonic()
            cli = subprocess.run(
                [sys.executable, "-m", "dq.cli.main", "put", QUEUE, "from-the-cli",
                 "--url", ",".join(urls)],
                cwd=REPO, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            cli_s = time.monotonic() - t0
            assert cli.returncode == 0, cli.stderr
            writes.ack(b"from-the-cli")
            time.sleep(max(0.0, stopped_at + STALL_S - time.monotonic()))
        finally:
            stalled.proc.send_signal(signal.SIGCONT)
        resumed_at = time.monotonic()
        count = writes.count()
        eventually("writes after the stall", lambda: True if writes.count() > count + 50 else None)
    finally:
        writes.stop.set()
        for p in producers:
            p.join(60)
        if stalled.proc is not None and stalled.proc.poll() is None:
            stalled.proc.send_signal(signal.SIGCONT)
    assert not any(p.is_alive() for p in producers)

    election_s = elected_at - stopped_at
    gap, gap_from = longest_gap(writes.times(), stopped_at, resumed_at)
    unknown = {who: len(v) for who, v in writes.unknown.items()}
    print(
        f"leader stopped {resumed_at - stopped_at:.1f} s: new leader after {election_s:.2f} s; "
        f"longest time without an acknowledged write {gap:.2f} s (from "
        f"{gap_from - stopped_at:+.2f} s); dq put {cli_s:.2f} s; {len(writes.acked)} "
        f"acknowledged, unknown {unknown}"
    )
    assert resumed_at - stopped_at >= STALL_S
    assert gap <= election_s + AFTER_ELECTION_S, writes.unknown
    # writes went on through the stall's end, not only once the stopped node woke
    during = [t for t in writes.times() if elected_at + AFTER_ELECTION_S < t < resumed_at]
    assert len(during) >= 20, len(during)
    assert cli_s < 15.0, cli_s  # the CLI's own timeout is 30 s
    # at most the requests in flight at the stop have unknown outcomes; none keyed
    assert "keyed" not in unknown, writes.unknown
    assert sum(unknown.values()) <= 4, writes.unknown

    def follows_successor() -> bool | None:
        doc = group.describe(first.node)
        return True if doc["role"] == "follower" and doc["epoch"] >= successor.epoch else None

    eventually("the woken leader following the new one", follows_successor, timeout=60)
    acked = set(writes.acked)
    delivered: set[bytes] = set()
    with Client(urls) as dq:
        give_up = time.monotonic() + 60
        while not acked <= delivered and time.monotonic() < give_up:
            for item in dq.dequeue(QUEUE, count=500, lease_ms=60_000, wait_ms=200):
                delivered.add(item.value)
                dq.release(QUEUE, item.id, item.receipt)
    missing = acked - delivered
    assert not missing, f"{len(missing)} acknowledged enqueues lost, e.g. {sorted(missing)[:5]}"
    assert delivered <= acked | writes.unknown_values, sorted(delivered - acked)[:5]
    for name, server in group.servers.items():
        log = server.log_path.read_text(errors="replace")
        errors = [line for line in log.splitlines() if " ERROR dq.server.errors" in line]
        assert not errors, f"{name}: {errors[:3]}"
