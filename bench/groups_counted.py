"""``bench/groups.py``'s dequeue counted instead of timed: Python calls and instructions
per delivery of a dequeue + release loop over many groups, half of them held back by
``group_limit`` 1, and the same loop without groups — figures that hold on a loaded
machine (``bench/counted.py``).

    python -m bench.groups_counted [--ops 2000] [--groups 20000] [--tree PATH] [--no-valgrind]

Each part's queue holds ``groups`` x 4 due items enqueued round robin over the groups;
with groups, the first item of every other group is leased first and kept, so the
cursor passes (and the delivery index holds) about one held-back item per delivery.
Instructions: a child run of 2N deliveries less one of N, over N, under callgrind (the
set-up, the same in both, cancels out). ``--tree /work/main`` counts another checkout.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from bench import counted

LONG = 3_600_000
BATCH = 10
_BENCH = os.path.dirname(os.path.abspath(__file__))
_MEASURED: dict[tuple[str, ...], float] = {}


def _engine(root: str, groups: int, grouped: bool) -> Any:
    """An engine whose queue "q" is filled as ``bench/groups.py`` fills it."""
    from dq.storage import Engine, EngineConfig, NewItem, QueueConfig

    e = Engine.open(root, EngineConfig(fsync="never", compaction="inline", auto_merge=False))
    e.put_queue("q", QueueConfig(group_limit=1 if grouped else None))
    held = groups // 2
    names = [f"g{n}" for n in range(0, groups, 2)]
    for start in range(0, held, 1000):
        chunk = names[start : start + 1000]
        e.enqueue("q", [NewItem(b"b", group=n if grouped else None) for n in chunk])
    leased = 0
    while leased < held:
        leased += len(e.dequeue("q", min(1000, held - leased), LONG))
    every = [f"g{n}" for n in range(groups)]
    batch: list[Any] = []
    for _round in range(4):
        for name in every:
            batch.append(NewItem(b"x" * 32, group=name if grouped else None))
            if len(batch) == 1000:
                e.enqueue("q", batch)
                batch = []
    if batch:
        e.enqueue("q", batch)
    return e


def _deliver(e: Any, n: int) -> None:
    from dq.storage import Release

    done = 0
    while done < n:
        got = e.dequeue("q", min(BATCH, n - done), 60_000)
        assert got, "the backlog ran out: fewer --ops or more --groups"
        e.release("q", [Release(d.id, d.receipt) for d in got])
        done += len(got)


def child_work(n: int, part: str, groups: int) -> None:
    root = tempfile.mkdtemp(prefix="dq-groups-counted-")
    try:
        e = _engine(root, groups, part == "grouped")
        _deliver(e, n)
        e.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def child_calls(n: int, groups: int) -> dict[str, dict[str, float]]:
    """Per delivery of each part: Python calls by module."""
    out: dict[str, dict[str, float]] = {}
    for part in ("plain", "grouped"):
        root = tempfile.mkdtemp(prefix="dq-groups-counted-")
        try:
            e = _engine(root, groups, part == "grouped")
            _deliver(e, 20)  # warm: first calls import and cache
            counts: collections.Counter[str] = collections.Counter()

            def prof(frame: Any, event: str, arg: Any, counts: Any = counts) -> None:
                if event == "call":
                    path = frame.f_code.co_filename
                    if os.path.dirname(path) != _BENCH:
                        counts[counted.module_of(path)] += 1

            sys.setprofile(prof)
            _deliver(e, n)
            sys.setprofile(None)
            out[part] = {k: v / n for k, v in sorted(counts.items())}
            e.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    return out


def _per_op(args: list[str], n: int, env: dict[str, str]) -> float:
    """Ir per delivery: a run of 2n less a run of n, over n."""
    key = (*args, str(n))
    if key not in _MEASURED:
        one = counted.callgrind("bench.groups_counted", [*args, "--ops", str(n)], env)[0]
        two = counted.callgrind("bench.groups_counted", [*args, "--ops", str(2 * n)], env)[0]
        _MEASURED[key] = (two - one) / n
    return _MEASURED[key]


def main() -> int:
    ap = counted.options(__doc__, 2000, "deliveries", ["work", "calls"])
    ap.add_argument("--groups", type=int, default=20_000, help="groups (x 4 items each)")
    args = counted.parse(ap)
    if args.child == "work":
        child_work(args.ops, args.part, args.groups)
        return 0
    if args.child == "calls":
        print(json.dumps(child_calls(args.ops, args.groups)))
        return 0
    env, tree, _ = counted.begin("bench.groups_counted", args.tree)
    got = subprocess.run(  # the calls of 200 deliveries with the run's --groups
        [
            sys.executable,
            "-m",
            "bench.groups_counted",
            *tree,
            "--child",
            "calls",
            "--ops",
            "200",
            "--groups",
            str(args.groups),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls = json.loads(got.stdout)
    ir: dict[str, float] = {}
    for part, title in (("plain", "no groups"), ("grouped", "group_limit 1, half held back")):
        print(f"\n## dequeue + release of {args.groups:,} groups' items, {title}, per delivery")
        counted.print_calls(calls[part])
        if args.no_valgrind:
            continue
        ir[part] = _per_op(
            [*tree, "--child", "work", "--part", part, "--groups", str(args.groups)],
            args.ops,
            env,
        )
        print(f"instructions: {ir[part]:,.0f}")
    if ir:
        print(f"\ngrouped / plain instructions: {ir['grouped'] / ir['plain']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
