"""Where a single durable operation's work goes, counted instead of timed, so the figures
hold on a loaded machine: Python calls by module and instructions (valgrind's callgrind).

Run from the repository root:  .venv/bin/python -m bench.hot_split [--ops 1000] [--tree PATH]

The workload is fixed and runs in one thread: ``--ops`` durable single enqueues of
256-byte items, then as many single dequeues each followed by the release of what it
got, on an engine with ``fsync always`` whose group commit runs on the calling thread
(as the server's loop runs it). Its log writes and syncs are real: callgrind counts the
process's own instructions, not the kernel's, so the disk is not in the figures. For each
part it prints, per operation:

- Python function calls, by module (``sys.setprofile``), and the calls into the
  in-memory segment (its methods, and reads of its ``entries``);
- instructions of the whole operation (callgrind's ``Ir``): a run of 2N operations less
  a run of N, divided by N, so start-up and imports cancel out;
- instructions of the in-memory segment alone: the calls it got per operation (counted
  above), replayed on a fresh segment with keys, values and stats as the engine makes
  them, under callgrind the same way.

``--tree PATH`` measures another checkout (e.g. a ``git worktree`` of an older commit),
so a change is measured before and after on the same machine. Needs ``valgrind``
(Debian's package); ``--no-valgrind`` prints the call counts alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
from typing import Any

from bench import counted

VALUE = b"v" * 256
#: the benchmarks' folder: calls into its code are the workload's, not the engine's
_BENCH = os.path.dirname(__file__)
#: the in-memory segment's methods the engine calls, and the reads of its entries
MEMSEG_CALLS = ("add", "add_pending", "add_tombstones_behind", "next_after", "net_upto")


def _engine(data: str) -> tuple[Any, Any]:
    """An engine committing on the calling thread, and its queue "q" (created)."""
    from bench.engine_cpu import committing_inline

    eng = committing_inline(data, auto_merge=False)
    eng.ensure_queue("q")
    return eng, eng.queue("q")


def _run(eng: Any, q: Any, n: int, part: str) -> None:
    from dq.storage import NewItem
    from dq.storage.types import Release

    if part == "enqueue":
        for _ in range(n):
            fut = eng.enqueue_nowait("q", [NewItem(VALUE)])
            q.sync_round()
            fut.result(0)
    else:
        for _ in range(n):
            (d,) = eng.dequeue("q", 1, None)
            fut = eng.release_nowait("q", [Release(d.id, d.receipt)])
            q.sync_round()
            fut.result(0)


def child_work(n: int, part: str) -> None:
    """The workload: ``n`` enqueues (and for "dequeue", then ``n`` dequeue+release)."""
    data = tempfile.mkdtemp(prefix="dq-hot-split-")
    try:
        eng, q = _engine(data)
        _run(eng, q, n, "enqueue")
        if part == "dequeue":
            _run(eng, q, n, "dequeue")
        eng.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)


def child_calls(n: int) -> dict[str, dict[str, float]]:
    """Per operation of each part: Python calls by module, and calls into the segment."""
    out: dict[str, dict[str, float]] = {}
    data = tempfile.mkdtemp(prefix="dq-hot-split-")
    try:
        eng, q = _engine(data)
        _run(eng, q, 10, "enqueue")  # warm: first calls import and cache
        _run(eng, q, 10, "dequeue")
        for part in ("enqueue", "dequeue"):
            counts: collections.Counter[str] = collections.Counter()

            def prof(frame: Any, event: str, arg: Any, counts: Any = counts) -> None:
                if event == "call":
                    path = frame.f_code.co_filename
                    if os.path.dirname(path) == _BENCH:
                        return  # the workload's own loop, and its stand-in syncer
                    mod = counted.module_of(path)
                    counts[mod] += 1
                    if mod == "storage/memseg.py" and frame.f_code.co_name in MEMSEG_CALLS:
                        counts["memseg " + frame.f_code.co_name] += 1
                elif event == "c_call":
                    name = getattr(arg, "__qualname__", "")
                    owner = name.split(".")[0]
                    if owner in ("MemSegment", "Entries") and name.split(".")[-1] in (
                        *MEMSEG_CALLS,
                        "get",
                    ):
                        counts["memseg " + name.split(".")[-1]] += 1

            sys.setprofile(prof)
            _run(eng, q, n, part)
            sys.setprofile(None)
            out[part] = {k: v / n for k, v in sorted(counts.items())}
        eng.close()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return out


def child_replay(n: int, part: str, per_op: dict[str, float]) -> None:
    """The segment's calls of ``n`` operations of ``part``, on a fresh segment."""
    from dq.storage.codec import encode_key, encode_stats
    from dq.storage.memseg import MemSegment

    mem = MemSegment(1)
    stats = encode_stats(1_700_000_000_000, 0, 0)
    keys = [encode_key(1_700_000_000_000 + i // 3, i + 1) for i in range(n)]
    for key in keys:
        mem.add_pending([(key, VALUE)], stats)
    if part != "dequeue":
        return
    # a dequeue asks next_after of the cursor (the key before) several times, reads the
    # entry, and its release counts one tombstone behind the cursor
    asks = round(per_op.get("memseg next_after", 0))
    reads = round(per_op.get("memseg get", 1))
    cursor = b""
    for key in keys:
        for _ in range(asks):
            mem.next_after(cursor)
        for _ in range(reads):
            mem.entries.get(key)
        mem.add_tombstones_behind(1)
        cursor = key


_MEASURED: dict[tuple[str, ...], float] = {}


def _per_op(args: list[str], n: int, env: dict[str, str]) -> float:
    """Ir per operation: a run of 2n less a run of n, over n (each measured once)."""
    key = (*args, str(n))
    if key not in _MEASURED:
        one = counted.callgrind("bench.hot_split", [*args, "--ops", str(n)], env)[0]
        two = counted.callgrind("bench.hot_split", [*args, "--ops", str(2 * n)], env)[0]
        _MEASURED[key] = (two - one) / n
    return _MEASURED[key]


def main() -> int:
    ap = counted.options(__doc__, 1000, "operations", ["work", "calls", "replay"])
    ap.add_argument("--per-op", default="{}", help=argparse.SUPPRESS)
    args = counted.parse(ap)
    if args.child == "work":
        child_work(args.ops, args.part)
        return 0
    if args.child == "replay":
        child_replay(args.ops, args.part, json.loads(args.per_op))
        return 0
    if args.child == "calls":
        print(json.dumps(child_calls(args.ops)))
        return 0

    env, tree, calls = counted.begin("bench.hot_split", args.tree)
    replay = {
        part: [*tree, "--child", "replay", "--part", part, "--per-op", json.dumps(calls[part])]
        for part in ("enqueue", "dequeue")
    }
    for part, title in (("enqueue", "durable single enqueue"), ("dequeue", "dequeue + release")):
        c = calls[part]
        print(f"\n## {title}, per operation")
        counted.print_calls({k: v for k, v in c.items() if not k.startswith("memseg ")})
        seg = {k: v for k, v in c.items() if k.startswith("memseg ")}
        print(
            "calls into the in-memory segment: "
            + ", ".join(f"{k[7:]} {v:.1f}" for k, v in seg.items())
        )
        if args.no_valgrind:
            continue
        # a dequeue+release's share: the run with both parts less the run of enqueues
        whole = _per_op([*tree, "--child", "work", "--part", part], args.ops, env)
        seg_ir = _per_op(replay[part], args.ops, env)
        if part == "dequeue":
            whole -= _per_op([*tree, "--child", "work", "--part", "enqueue"], args.ops, env)
            seg_ir -= _per_op(replay["enqueue"], args.ops, env)
        print(f"instructions: {whole:,.0f}, of which the in-memory segment's calls {seg_ir:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
