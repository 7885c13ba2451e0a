"""What a log's allocation step does to its syncs, counted in the kernel: the sleeps of
one thread appending records to a log (``WalWriter``, the engine's own, through
``fileio``) with one ``fdatasync`` each, by what each waited for.

Run from the repository root:  .venv/bin/python -m bench.prealloc_probe [--ops 3000]

For each allocation policy — plain appends, fixed 64 KiB steps, fixed 1 MiB steps, and
the engine's adaptive step (``storage/prealloc.py``: 64 KiB doubling to 1 MiB while the
log is hot) — a child process writes ``--ops`` records of ``--size`` bytes, each its
own durable round (``WalWriter.write_and_sync``, as a lone client's write), ``--gap-ms``
apart, to a new log in ``--dir`` (default: a temporary directory, so the file system of
``/tmp``). It prints per sync: ``fallocate`` calls, the thread's voluntary context
switches (``/proc/self/status``) and, under ``perf record -e sched:sched_switch -g``,
what each sleep waited for (``bench/http_syscalls.py``'s kernel-stack labels: the data's
writeback, the inode's block, the cache flush). Counts, not times: they depend on the
file system and the kernel, not on the load, except through how soon a log uses up its
step (the adaptive rule reads a clock). Needs perf.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.http_syscalls import _WAITS

#: policy -> (first step, largest step); a first step of 0 appends plainly
POLICIES = {
    "append": (0, 0),
    "fixed 64 KiB": (64 << 10, 64 << 10),
    "fixed 1 MiB": (1 << 20, 1 << 20),
    "adaptive": (64 << 10, 1 << 20),
}


def _switches() -> int:
    text = Path("/proc/thread-self/status").read_text()
    m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M)
    assert m
    return int(m.group(1))


def child(directory: str, base: int, cap: int, ops: int, size: int, gap_ms: float) -> None:
    """Write ``ops`` durable records; print the counts this process can see itself."""
    from dq.storage import fileio
    from dq.storage.config import EngineConfig
    from dq.storage.prealloc import allocation_step
    from dq.storage.wal import WalWriter

    allocations = 0
    allocate = fileio.allocate

    def counted(fd: int, offset: int, length: int, path: str) -> bool:
        nonlocal allocations
        allocations += 1
        return allocate(fd, offset, length, path)

    fileio.allocate = counted  # counted, not hooked: a hook would split the round's calls
    try:
        config = EngineConfig(wal_prealloc_bytes=base, wal_prealloc_max_bytes=cap)
        wal = WalWriter.create(directory, 1, 1, allocation_step(config))
        payload = os.urandom(size)
        before = _switches()
        for _ in range(ops):
            wal.append(payload)
            data, _seq = wal.take_buffer()
            with wal.io_lock:
                wal.write_and_sync(data)
            if gap_ms:
                time.sleep(gap_ms / 1000)
        switches = _switches() - before
        ahead = os.path.getsize(wal.path) - wal.offset
        wal.close(sync=True)
    finally:
        fileio.allocate = allocate
    print(
        f"RESULT fallocate={allocations / ops:.4f} voluntary={switches / ops:.3f} "
        f"ahead_at_end={ahead}"
    )


def run(policy: str, args: argparse.Namespace) -> dict[str, float | str]:
    base, cap = POLICIES[policy]
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="dq-prealloc-probe-") as d:
        cmd = [sys.executable, "-m", "bench.prealloc_probe", "--child", str(base), str(cap)]
        cmd += ["--ops", str(args.ops), "--size", str(args.size), "--gap-ms", str(args.gap_ms)]
        cmd += ["--dir", d]
        plain = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600)
        got: dict[str, float | str] = {}
        for part in plain.stdout.split("RESULT", 1)[1].split():
            k, _, v = part.partition("=")
            got[k] = float(v)
        data = os.path.join(d, "perf.data")
        record = ["perf", "record", "-q", "-e", "sched:sched_switch", "-g", "-o", data, "--"]
        subprocess.run(record + cmd, capture_output=True, check=True, timeout=600)
        text = subprocess.run(
            ["perf", "script", "-i", data, "-F", "tid,trace,ip,sym"],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        ).stdout
    sleeps: collections.Counter[str] = collections.Counter()
    for block in text.strip().split("\n\n"):
        head, _, stack = block.strip().partition("\n")
        m = re.search(r"prev_state=(\S+)", head)
        if not m or m.group(1).startswith("R"):
            continue  # preempted, not asleep
        what = next((label for fn, label in _WAITS if fn in stack), "other")
        sleeps[what] += 1
    for what, k in sleeps.items():
        got[what] = k / args.ops
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=3000)
    ap.add_argument("--size", type=int, default=300, help="record payload bytes")
    ap.add_argument("--gap-ms", type=float, default=0.0, help="pause between records")
    ap.add_argument("--dir", default=None, help="where the logs are written")
    ap.add_argument("--rounds", type=int, default=2, help="each policy this many times")
    ap.add_argument("--child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.dir, args.child[0], args.child[1], args.ops, args.size, args.gap_ms)
        return 0
    print(
        f"# load {os.getloadavg()[0]:.1f}; {args.ops} records of {args.size} bytes, "
        f"{args.gap_ms} ms apart, one fdatasync each; per sync (counts, not times)"
    )
    for _ in range(args.rounds):  # alternated: the file system's state drifts
        for policy in POLICIES:
            got = run(policy, args)
            fields = ", ".join(
                f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                for k, v in sorted(got.items())
            )
            print(f"{policy}: {fields}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
