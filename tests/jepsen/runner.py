"""One Jepsen-style run: network, etcd, dq, workload, nemesis, heal, drain, history.

Run it only inside fresh namespaces, as the test does::

    unshare --net --mount --pid --fork --kill-child --mount-proc \\
        python -m tests.jepsen.runner --seconds 40 --out DIR

It refuses to start unless it is pid 1 of a new pid namespace with a network that has
nothing but ``lo``: then everything it starts (and every rule, qdisc and namespace it
makes) ends with it, whatever happens. ``DIR`` receives ``history.jsonl`` (written as
the run goes), ``summary.json``, ``report.txt`` (the checker's verdict),
``runner.log`` and ``logs/`` (every process's output). Exit status: 0 the run
completed (the checker may still have failed: see ``report.txt``), 2 the harness
failed (``summary.json`` says why).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import httpx

from tests.jepsen.checker import check
from tests.jepsen.cluster import Cluster, Monitor
from tests.jepsen.history import History, load
from tests.jepsen.nemesis import EXTRA_FAULTS, FAULTS, Nemesis
from tests.jepsen.netns import Network
from tests.jepsen.procs import Supervisor
from tests.jepsen.timeline import outages
from tests.jepsen.workload import LEASE_MS, QUEUE, Workload

__all__ = ["main"]

log = logging.getLogger("jepsen")


class _Terminated(Exception):
    pass


def _on_term(signum: int, frame: object) -> None:
    raise _Terminated(f"signal {signum}")


def _isolated() -> str | None:
    """Why this process must not touch the network, or None when it may."""
    if os.getpid() != 1:
        return "not pid 1 of a new pid namespace (run under unshare --pid --fork)"
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, timeout=10)
    names = {line.split(":")[1].strip().split("@")[0] for line in links.stdout.splitlines()}
    if names != {"lo"}:
        return f"the network namespace is not fresh (links: {sorted(names)})"
    return None


def _drain(workload: Workload, timeout: float) -> dict[str, Any]:
    """Consumers keep going until every acknowledged value came out and nothing has
    come out for a lease and a half (so unreleased items had their chance to return)."""
    quiet_s = LEASE_MS / 1000 * 1.5
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        missing = workload.missing()
        with workload.lock:
            idle = time.time() - workload.last_delivery
        if not missing and idle > quiet_s:
            break
        time.sleep(0.2)
    return {"drain_s": round(time.monotonic() - start, 1), "missing": len(workload.missing())}


def _replicas(cluster: Cluster, monitor: Monitor, timeout: float = 30.0) -> dict[str, Any]:
    """Once the writes have stopped and every follower has acknowledged the leader's last
    record, every member must hold the same items: its ``pending`` count and ``next_id``
    (``GET /v1/queues/<q>``, served by any member from its own copy). A member holding
    items the leader does not (or the reverse) would hand them out after a failover."""
    leader = monitor.wait_leader(timeout)
    others = [n for n in cluster.net.nodes if n != leader]
    give_up = time.monotonic() + timeout
    caught_up = False
    while time.monotonic() < give_up:
        doc = monitor.doc(leader)
        followers = doc.get("followers") or {}
        lsn = doc.get("lsn")
        if lsn is not None and all((followers.get(f"n{n}") or {}).get("acked") == lsn for n in others):  # fmt: skip
            caught_up = True
            break
        time.sleep(0.2)
    nodes: dict[str, Any] = {}
    for n in cluster.net.nodes:
        try:
            r = httpx.get(f"{cluster.url(n)}/v1/queues/{QUEUE}", timeout=5.0)
            stats = r.json()["stats"]
            nodes[f"n{n}"] = {"pending": stats["pending"], "next_id": stats["next_id"]}
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            nodes[f"n{n}"] = {"error": repr(exc)}
    return {"leader": f"n{leader}", "caught_up": caught_up, "nodes": nodes}


def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {"seconds": args.seconds, "nodes": args.nodes}
    prefix = f"h5j{os.getppid() % 100000}"
    net = Network(prefix, args.nodes)
    sup = Supervisor(out / "logs")
    data_root = Path(tempfile.mkdtemp(prefix="dq-jepsen-", dir=args.data_root))
    cluster = Cluster(net, sup, data_root, memseg=args.memseg, replicated=not args.no_etcd)
    history = History(out / "history.jsonl")
    monitor = Monitor(cluster, history)
    workload: Workload | None = None
    nemesis: Nemesis | None = None
    try:
        net.setup()
        summary["netem"] = net.netem
        if args.disk_mb:
            cluster.mount_disks(args.disk_mb)
        if not args.no_etcd:
            cluster.start_etcd()
        cluster.start_dq()
        monitor.start()
        summary["first_leader"] = monitor.wait_leader(60)
        workload = Workload(
            cluster.urls(), history, keys=not args.no_keys, value_bytes=args.value_bytes
        )
        workload.create_queue()
        workload.start()
        faults = tuple(args.faults.split(",")) if args.faults else FAULTS
        nemesis = Nemesis(
            cluster, monitor, history, faults=faults, rng=random.Random(args.rng),
            stall_dump=args.stall_dump,
        )  # fmt: skip
        nemesis.run(args.seconds)
        nemesis.heal()
        summary["leader_after_heal"] = monitor.wait_leader(60)
        workload.stop_producers()
        summary.update(_drain(workload, args.drain_seconds))
        workload.stop()
        summary["replicas"] = _replicas(cluster, monitor)
    finally:
        if nemesis is not None:
            nemesis.stopping.set()
            summary["faults"] = nemesis.applied
        if workload is not None:
            workload.stop()
            summary["counts"] = workload.counts
        summary["cluster"] = monitor.describe()
        monitor.stop()
        sup.close()
        summary["restarts"] = {n: p.starts - 1 for n, p in sup.procs.items() if p.starts > 1}
        net.teardown()
        history.close()
        if not args.keep_data:
            cluster.remove_data()
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--seconds", type=float, default=40.0, help="how long the nemesis runs")
    p.add_argument("--out", type=Path, required=True, help="artifacts directory")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--no-etcd", action="store_true", help="one unreplicated dq (harness check)")
    p.add_argument(
        "--faults",
        default="",
        help=f"comma-separated, among {','.join(FAULTS + EXTRA_FAULTS)} (default: the first six)",
    )
    p.add_argument("--memseg", type=int, default=64 << 10, help="DQ_MEMSEG_BYTES of every node")
    p.add_argument("--drain-seconds", type=float, default=30.0)
    p.add_argument("--rng", type=int, default=None, help="fault order (random when absent)")
    p.add_argument("--data-root", default=None, help="where node data directories go")
    p.add_argument("--keep-data", action="store_true")
    p.add_argument("--no-keys", action="store_true", help="no keyed producer")
    p.add_argument(
        "--value-bytes", type=int, default=0, help="pad values to this size (checked on delivery)"
    )
    p.add_argument(
        "--disk-mb",
        type=int,
        default=128,
        help="each node's dq disk is a tmpfs of this size (0: a directory on the disk)",
    )
    p.add_argument(
        "--stall-dump",
        action="store_true",
        help="SIGABRT a follower still out of sync 8 s after a heal (its log gets every stack)",
    )
    args = p.parse_args(argv)
    out: Path = args.out
    (out / "logs").mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=out / "runner.log",
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    signal.signal(signal.SIGTERM, _on_term)
    if args.rng is None:
        args.rng = random.randrange(1 << 30)
    reason = _isolated()
    if reason is not None:
        print(f"refusing to run: {reason}", file=sys.stderr)
        return 2
    status = 0
    summary: dict[str, Any] = {}
    try:
        summary = run(args, out)
    except BaseException as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
        summary["traceback"] = traceback.format_exc()
        log.exception("run failed")
        status = 2
    summary["rng"] = args.rng
    try:
        events = load(out / "history.jsonl")
        report = check(events)
        (out / "report.txt").write_text(report.describe() + "\n")
        summary["checker_ok"] = report.ok
        summary["outages"] = outages(events)
    except (OSError, KeyError, ValueError) as exc:
        summary["checker_error"] = repr(exc)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
