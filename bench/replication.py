"""Replication's cost and its failover: a 3-member cluster beside a single node.

Run from the repository root (etcd 3.4 installed: Debian's ``etcd-server``):

    .venv/bin/python -m bench.replication [--etcd-members 3] [--kills 20] [--json OUT]

Starts 1 or 3 etcd members and three ``dq serve --fsync always`` with replication on,
and one ``dq serve --fsync always`` without, all on 127.0.0.1 (processes stopped by
their PID at the end, also on error), and measures:

- (a) batched durable enqueue, items/s: ``--conns`` keep-alive connections each sending
  batches of ``--batch`` items of 256 bytes for ``--seconds``, to the leader and to the
  single node (target: the cluster at least 0.5x the single node);
- (b) single durable enqueue latency, p50/p99: one connection, one item per request
  (target: the cluster at most 2x the single node); (a) and (b) are taken in
  ``--rounds`` rounds alternating between the two, both running, so that the shared
  machine's changing load falls on both alike;
- (c) failover: ``--kills`` times, under a write load (one writer, one item per request,
  following 421s and trying the other members on errors), SIGKILL the leader and time
  the first write accepted after the kill; the killed member is started again (a full
  resync) and every member is back in the sync set before the next kill (target: p99
  at most 5 s);
- (d) acknowledged enqueues lost: at the end every value the writer got a 200 for must
  be dequeued from the last leader (target: 0);
- (e) before the kills, a follower is SIGKILLed under the same write load: the longest
  wait between two acknowledged writes (the leader waits for it until
  ``DQ_REPLICA_TIMEOUT_MS``, then drops it from the sync set).

The settings are the server's defaults (``docs/replication.md``) unless given with
``--env NAME=VALUE``. It prints a table; ``docs/performance.md`` ("Replication") has
the current figures and the machine, ``bench/NOTES.md`` every run.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import itertools
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.replication_cluster import ETCD, Cluster, Node

VALUE = "v" * 256
QUEUE = "bench"
_JSON = {"content-type": "application/json"}
_TICK = os.sysconf("SC_CLK_TCK")


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


class Poster:
    """One keep-alive connection per URL; ``post`` answers (status, headers, body) or raises."""

    def __init__(self, timeout: float = 5.0) -> None:
        self.timeout = timeout
        self.conns: dict[str, http.client.HTTPConnection] = {}

    def post(self, url: str, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        conn = self.conns.get(url)
        if conn is None:
            host, port = url.removeprefix("http://").split(":")
            conn = self.conns[url] = http.client.HTTPConnection(host, int(port), self.timeout)
        try:
            conn.request("POST", path, body, _JSON)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        except BaseException:
            conn.close()
            del self.conns[url]
            raise

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


def enqueue_body(values: list[str]) -> bytes:
    return json.dumps({"items": [{"value": v} for v in values]}).encode()


def throughput(url: str, conns: int, batch: int, seconds: float) -> float:
    """Items/s acknowledged by ``url`` over ``seconds`` (after a one-second warm-up)."""
    body = enqueue_body([VALUE] * batch)
    counts = [0] * conns
    start, stop = time.monotonic() + 1.0, time.monotonic() + 1.0 + seconds
    errors: list[str] = []

    def run(i: int) -> None:
        poster = Poster(timeout=30)
        try:
            while (now := time.monotonic()) < stop:
                status, _, reply = poster.post(url, f"/v1/queues/{QUEUE}/items", body)
                if status != 200:
                    errors.append(f"{status} {reply[:200]!r}")
                    return
                if now >= start:
                    counts[i] += batch
        finally:
            poster.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 60)
    if errors:
        raise RuntimeError(f"batched enqueue to {url} failed: {errors[0]}")
    return sum(counts) / seconds


def latencies(url: str, requests: int) -> list[float]:
    """Seconds per single-item durable enqueue, one after another on one connection."""
    poster = Poster(timeout=30)
    body = enqueue_body([VALUE])
    out = []
    try:
        for _ in range(requests):
            t0 = time.perf_counter()
            status, _, reply = poster.post(url, f"/v1/queues/{QUEUE}/items", body)
            out.append(time.perf_counter() - t0)
            if status != 200:
                raise RuntimeError(f"enqueue to {url} answered {status}: {reply[:200]!r}")
    finally:
        poster.close()
    return out


class Writer(threading.Thread):
    """Enqueues unique values one at a time to whoever leads, recording every outcome.

    ``acked`` holds (monotonic time sent, time answered, value) for each 200; anything
    else (an error, a timeout, a dropped connection) is unknown or refused, never counted
    as acknowledged.
    """

    def __init__(self, urls: list[str], prefix: str) -> None:
        super().__init__(name=f"bench-writer-{prefix}", daemon=True)
        self.prefix = prefix
        self.urls, self.target = urls, urls[0]
        self.acked: list[tuple[float, float, str]] = []
        self.unknown = self.refused = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        poster, seq = Poster(timeout=5.0), 0
        while not self.stopping.is_set():
            value = f"{self.prefix}{seq}"
            sent = time.monotonic()
            try:
                status, headers, _ = poster.post(
                    self.target, f"/v1/queues/{QUEUE}/items", enqueue_body([value])
                )
            except (OSError, http.client.HTTPException):
                self.unknown += 1
                seq += 1
                self._next_target(None)
                continue
            seq += 1
            if status == 200:
                self.acked.append((sent, time.monotonic(), value))
                continue
            self.refused += status != 503
            self.unknown += status == 503
            self._next_target(headers.get("x-dq-leader") or headers.get("X-DQ-Leader"))
        poster.close()

    def _next_target(self, named: str | None) -> None:
        if named in self.urls and named != self.target:
            self.target = named
            return
        self.target = self.urls[(self.urls.index(self.target) + 1) % len(self.urls)]
        self.stopping.wait(0.02)

    def first_ack_after(self, t: float, timeout: float) -> float | None:
        """When the first write *sent* after ``t`` was acknowledged (None if none in
        ``timeout``): an answer the old leader sent just before its kill does not count."""
        give_up = time.monotonic() + timeout
        while time.monotonic() < give_up:
            recent = self.acked[-1000:]
            i = bisect.bisect_right([sent for sent, _, _ in recent], t)
            if i < len(recent):
                return recent[i][1]
            time.sleep(0.005)
        return None


def follower_stall(cluster: Cluster, log: Callable[[str], None]) -> tuple[float, set[str]]:
    """SIGKILL a follower under the write load: the longest wait between two acknowledged
    writes after it (the leader waits for it until ``DQ_REPLICA_TIMEOUT_MS``, then drops
    it from the sync set). The follower is started again and back in sync on return.
    Returns the wait and the values acknowledged meanwhile."""
    leader = cluster.wait_in_sync(3, timeout=120)
    writer = Writer(cluster.urls, "stall-")
    writer.target = leader.url
    writer.start()
    try:
        time.sleep(1.0)
        follower = next(n for n in cluster.nodes if n is not leader)
        t_kill = time.monotonic()
        follower.kill()
        time.sleep(6.0)
        t_end = time.monotonic()
    finally:
        writer.stopping.set()
        writer.join(30)
    times = [t_kill, *(t for _, t, _ in writer.acked if t_kill < t < t_end), t_end]
    stall = max(b - a for a, b in itertools.pairwise(times))
    log(f"  follower {follower.name} killed: writes waited at most {stall:.2f} s")
    follower.start()
    follower.wait_up()
    cluster.wait_in_sync(3, timeout=120)
    return stall, {v for _, _, v in writer.acked}


def failovers(
    cluster: Cluster, kills: int, log: Callable[[str], None], acked_before: set[str]
) -> dict[str, Any]:
    """Kill the leader ``kills`` times under a write load; seconds to the next accepted
    write. ``acked_before``: values acknowledged earlier, also checked at the end."""
    writer = Writer(cluster.urls, "failover-")
    writer.start()
    times: list[float] = []
    misses = 0
    try:
        for k in range(kills):
            leader = cluster.wait_in_sync(3, timeout=120)
            time.sleep(1.0)  # some writes on this leader
            t_kill = time.monotonic()
            leader.kill()
            first = writer.first_ack_after(t_kill, timeout=60)
            if first is None:
                misses += 1
                log(f"  kill {k + 1}: {leader.name} killed, no write accepted within 60 s")
            else:
                times.append(first - t_kill)
                log(f"  kill {k + 1}: {leader.name} killed, writes again after {times[-1]:.2f} s")
            leader.start()
            leader.wait_up()
        cluster.wait_in_sync(3, timeout=120)
        time.sleep(0.5)
    finally:
        writer.stopping.set()
        writer.join(30)
    acked = {v for _, _, v in writer.acked} | acked_before
    lost = lost_acks(cluster, acked)
    return {
        "kills": kills,
        "no_write_within_60s": misses,
        "failover_s": times,
        "acked": len(acked),
        "unknown": writer.unknown,
        "refused": writer.refused,
        "lost": lost,
    }


def lost_acks(cluster: Cluster, acked: set[str]) -> list[str]:
    """Drain the queue from the leader; the acknowledged values never delivered."""
    leader = cluster.wait_in_sync(2, timeout=60)
    poster, empty = Poster(timeout=30), 0
    seen: set[str] = set()
    body = json.dumps({"count": 1000, "lease_ms": 600_000, "wait_ms": 200}).encode()
    try:
        while empty < 2:
            status, _, reply = poster.post(leader.url, f"/v1/queues/{QUEUE}/dequeue", body)
            if status != 200:
                raise RuntimeError(f"drain: dequeue answered {status}: {reply[:200]!r}")
            items = json.loads(reply)["items"]
            empty = empty + 1 if not items else 0
            seen.update(it["value"] for it in items)
    finally:
        poster.close()
    return sorted(acked - seen)


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of every thread of ``pid`` (its children not included), or of one
    ``thread`` (``pid`` itself: the main thread, a server's event loop)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def measure_ab(
    targets: dict[str, tuple[str, dict[str, tuple[int, int | None]]]], args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    """(a) and (b) for each target (name: (url, {label: (pid, thread or None)})), taken in
    ``args.rounds`` alternating rounds so that a change in the machine's load falls on
    all alike: the rate is the mean of the rounds, the latencies are pooled, and the CPU
    each process spent during (b) is divided by the requests (ms per single enqueue)."""
    rates: dict[str, list[float]] = {name: [] for name in targets}
    lats: dict[str, list[float]] = {name: [] for name in targets}
    cpu: dict[str, dict[str, float]] = {
        name: dict.fromkeys(t[1], 0.0) for name, t in targets.items()
    }
    for _ in range(args.rounds):
        for name, (url, pids) in targets.items():
            rates[name].append(throughput(url, args.conns, args.batch, args.seconds / args.rounds))
            before = {p: cpu_seconds(*ids) for p, ids in pids.items()}
            lats[name] += latencies(url, args.requests // args.rounds)
            for p, ids in pids.items():
                cpu[name][p] += cpu_seconds(*ids) - before[p]
    return {
        name: {
            "batch_items_per_s": sum(rates[name]) / len(rates[name]),
            "batch_rounds": rates[name],
            "p50_ms": percentile(lats[name], 0.5) * 1000,
            "p99_ms": percentile(lats[name], 0.99) * 1000,
            "cpu_ms_per_single_enqueue": {
                p: round(sec * 1000 / len(lats[name]), 3) for p, sec in cpu[name].items()
            },
        }
        for name in targets
    }


def report(
    single: dict[str, Any], repl: dict[str, Any], fo: dict[str, Any] | None, members: int
) -> str:
    rows = [
        ("(a) batched enqueue, items/s", "batch_items_per_s", "{:,.0f}", ">= 0.5x", True),
        ("(b) single enqueue p50, ms", "p50_ms", "{:.2f}", "<= 2x", False),
        ("(b) single enqueue p99, ms", "p99_ms", "{:.2f}", "<= 2x", False),
    ]
    lines = [
        f"| measure | single node | {members} members | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for label, key, fmt, target, higher in rows:
        ratio = repl[key] / single[key]
        met = ratio >= 0.5 if higher else ratio <= 2.0
        lines.append(
            f"| {label} | {fmt.format(single[key])} | {fmt.format(repl[key])} "
            f"| {ratio:.2f}x | {target} | {'yes' if met else 'no'} |"
        )
    cpu_single, cpu_repl = single["cpu_ms_per_single_enqueue"], repl["cpu_ms_per_single_enqueue"]
    whole = sum(ms for p, ms in cpu_repl.items() if "event loop" not in p)
    parts = ", ".join(f"{p} {ms:.2f}" for p, ms in cpu_repl.items())
    lines.append(
        f"| (b) server CPU per single enqueue, ms | {cpu_single['single']:.2f} (its event "
        f"loop {cpu_single['its event loop']:.2f}) | {whole:.2f} ({parts}) "
        f"| {whole / cpu_single['single']:.2f}x | | |"
    )
    if fo is not None:
        t = fo["failover_s"]
        p99 = percentile(t, 0.99)
        lines.append(
            f"| (c) failover over {fo['kills']} kills, s | | p50 {percentile(t, 0.5):.2f}, "
            f"p99 {p99:.2f}, max {max(t, default=float('nan')):.2f} "
            f"({fo['no_write_within_60s']} with no write in 60 s) | | p99 <= 5 s "
            f"| {'yes' if p99 <= 5 and not fo['no_write_within_60s'] else 'no'} |"
        )
        lines.append(
            f"| (d) acknowledged enqueues lost | | {len(fo['lost'])} of {fo['acked']} "
            f"({fo['unknown']} unknown, {fo['refused']} refused) | | 0 "
            f"| {'yes' if not fo['lost'] else 'no'} |"
        )
        lines.append(
            f"| (e) a follower killed: longest wait between acknowledged writes, s | "
            f"| {fo['follower_stall_s']:.2f} | | `DQ_REPLICA_TIMEOUT_MS` | |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--etcd-members", type=int, choices=(1, 3), default=3)
    ap.add_argument(
        "--members",
        type=int,
        choices=(1, 2, 3),
        default=3,
        help="dq members (1: the replication machinery with no follower; give "
        "--env DQ_MIN_INSYNC=1 and --kills 0)",
    )
    ap.add_argument("--conns", type=int, default=4, help="connections for (a)")
    ap.add_argument("--batch", type=int, default=100, help="items per request in (a)")
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of (a), all rounds")
    ap.add_argument("--rounds", type=int, default=4, help="alternating rounds of (a) and (b)")
    ap.add_argument("--requests", type=int, default=1000, help="single enqueues in (b)")
    ap.add_argument("--kills", type=int, default=20, help="leader kills in (c); 0 skips")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the members")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the data root (logs)")
    args = ap.parse_args()
    if not os.path.exists(ETCD):
        ap.error("etcd not found (apt-get install etcd-server)")
    if args.kills and args.members != 3:
        ap.error("the failover measurement needs three members (--kills 0 otherwise)")
    env = dict(kv.split("=", 1) for kv in args.env)
    root = Path(tempfile.mkdtemp(prefix="dq-bench-repl-"))
    started = datetime.now(UTC)
    load_before = os.getloadavg()

    def log(msg: str) -> None:
        print(msg, flush=True)

    try:
        log(f"data under {root}; load {load_before[0]:.2f} {load_before[1]:.2f}")
        single_node = Node.single(root)
        cluster = Cluster(root, args.etcd_members, env, args.members)
        try:
            single_node.start()
            single_node.wait_up()
            cluster.start()
            leader = cluster.wait_in_sync(args.members, timeout=120)
            both = measure_ab(
                {
                    "single": (
                        single_node.url,
                        {
                            "single": (single_node.pid, None),
                            "its event loop": (single_node.pid, single_node.pid),
                        },
                    ),
                    "replicated": (
                        leader.url,
                        {
                            **{
                                ("leader" if n is leader else f"follower {n.name}"): (n.pid, None)
                                for n in cluster.nodes
                            },
                            "leader's event loop": (leader.pid, leader.pid),
                        },
                    ),
                },
                args,
            )
            single, repl = both["single"], both["replicated"]
            log(f"single node: {single}")
            log(f"{args.members} members (leader {leader.name}): {repl}")
            single_node.close()
            fo = None
            if args.kills:
                stall, stall_acked = follower_stall(cluster, log)
                fo = failovers(cluster, args.kills, log, stall_acked)
                fo["follower_stall_s"] = stall
        finally:
            single_node.close()
            cluster.close()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()
    table = report(single, repl, fo, args.members)
    print()
    print(
        f"{started:%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, "
        f"etcd members {args.etcd_members}, load before {load_before[0]:.2f} / after "
        f"{load_after[0]:.2f} (1-min)"
    )
    print(table)
    if args.json:
        out: dict[str, Any] = {"started": started.isoformat(), "load": [load_before, load_after]}
        out |= {"single": single, "replicated": repl, "failover": fo, "args": vars(args)}
        args.json.write_text(json.dumps(out, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
