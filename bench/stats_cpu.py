"""What a queue's stats cost while many leases are out: the telemetry publisher reads
every queue's stats each second and ``/metrics`` on every scrape, under the queue lock,
so their cost must not grow with the number of leases. Also the single dequeue and
release beside those leases, which keep the index the stats read.

Run from the repository root:  .venv/bin/python -m bench.stats_cpu [--leased 10 100000]

The engine runs in process with ``fsync never``. Each figure is the 10th percentile
over many short chunks of calls (wall time of one thread, µs per call): on a shared
machine most chunks are slowed by other processes, the fastest ones are the code.
``--tree PATH`` measures another checkout (as ``bench/engine_cpu.py``), so before and
after can alternate in one session.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.engine_cpu import _use_tree


def measure(leased: int, rounds: int) -> dict[str, float]:
    from dq.storage import Engine, EngineConfig
    from dq.storage.types import NewItem, Release

    data = tempfile.mkdtemp(prefix="dq-stats-cpu-")
    try:
        eng = Engine.open(data, EngineConfig(fsync="never", compaction="inline"))
        eng.ensure_queue("q")
        for start in range(0, leased + 20 * rounds, 1000):
            n = min(1000, leased + 20 * rounds - start)
            eng.enqueue("q", [NewItem(b"v") for _ in range(n)])
        for start in range(0, leased, 1000):
            eng.dequeue("q", min(1000, leased - start), 3_600_000)
        pc = time.perf_counter
        stats: list[float] = []
        cycle: list[float] = []
        for _ in range(rounds):
            t0 = pc()
            for _ in range(10):
                eng.stats("q")
            stats.append((pc() - t0) / 10)
            t0 = pc()
            for _ in range(20):
                (d,) = eng.dequeue("q", 1, 60_000)
                eng.release("q", [Release(d.id, d.receipt)])
            cycle.append((pc() - t0) / 20)
        assert eng.stats("q").leased == leased
        eng.close()
        p10 = len(stats) // 10
        return {
            "stats": sorted(stats)[p10] * 1e6,
            "dequeue+release": sorted(cycle)[p10] * 1e6,
        }
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--leased", type=int, nargs="+", default=[10, 100_000])
    ap.add_argument("--rounds", type=int, default=100, help="chunks of calls per figure")
    ap.add_argument("--tree", help="measure the project checked out at this path")
    args = ap.parse_args()
    if args.tree:
        _use_tree(args.tree)
    import dq.storage

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    where = Path(dq.storage.__file__).resolve().parents[1]
    print(f"engine from {where}, load average {load}", flush=True)
    for n in args.leased:
        figures = measure(n, args.rounds)
        line = " | ".join(f"{k} {v:.1f}" for k, v in figures.items())
        print(f"{n:>7} leases out: µs per call: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
