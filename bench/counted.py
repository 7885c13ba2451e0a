"""What the counted benchmarks (``bench/hot_split.py``, ``bench/ring_split.py``, and in
part ``bench/http_split.py``) share.

Both say where one operation's work goes by counting it instead of timing it, so their
figures hold on a loaded machine: Python calls by module (a profiler in a child run of
200 operations of each part) and instructions (child runs under valgrind's callgrind, a
run of 2N operations less a run of N, over N, so start-up and imports cancel out). Each
runs itself again for those children (``python -m bench.NAME --child ...``).

The parts kept here are the ones that must be alike in both for a figure of one to mean
what the same figure of the other means: which module a call is counted under, their
options, the child that counts calls and the first line, callgrind's totals and how call
counts print.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "OTHERS",
    "begin",
    "callgrind",
    "module_of",
    "options",
    "parse",
    "print_calls",
]

#: what calls into the standard library and installed packages are counted under
OTHERS = "(standard library and dependencies)"
_OURS = re.compile(r"/(storage|server|shm|client|cli|pipeline)/([^/]+)\.py$")
_TOTALS = re.compile(r"^(?:summary|totals): (\d+)", re.M)


def module_of(path: str) -> str:
    """What a call into code of file ``path`` is counted under: ``storage/queue.py`` for
    a module of ours (of this checkout or of ``--tree``), else ``OTHERS``."""
    m = _OURS.search(path)
    if m is None or "-packages/" in path:
        return OTHERS
    return f"{m.group(1)}/{m.group(2)}.py"


def options(doc: str, ops: int, unit: str, children: Sequence[str]) -> argparse.ArgumentParser:
    """The options both take: ``--ops`` (N, counted in ``unit``), ``--tree``,
    ``--no-valgrind``, and the hidden ``--child`` (one of ``children``) and ``--part``
    of their child runs. The description is the first paragraph of ``doc``."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=ops, help=f"{unit} of each part (N)")
    ap.add_argument("--tree", help="measure the project checked out at this path")
    ap.add_argument("--no-valgrind", action="store_true", help="call counts only")
    ap.add_argument("--child", choices=list(children), help=argparse.SUPPRESS)
    ap.add_argument("--part", default="enqueue", help=argparse.SUPPRESS)
    return ap


def parse(ap: argparse.ArgumentParser) -> argparse.Namespace:
    """The options given; with ``--tree``, ``dq`` is imported from that checkout from
    here on (in this process: each child is given ``--tree`` again)."""
    args = ap.parse_args()
    if args.tree:
        from bench.engine_cpu import _use_tree

        _use_tree(args.tree)
    return args


def begin(module: str, tree: str | None) -> tuple[dict[str, str], list[str], dict[str, Any]]:
    """The run's start, in the parent: the environment of its children (a fixed hash
    seed, so that a run of 2N and a run of N differ by the operations alone), the
    ``--tree`` they are given, what ``module``'s child ``calls`` counts in 200 operations
    of each part (its JSON), and the first line printed: the checkout measured and the
    load (which the counts ignore)."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    given = ["--tree", tree] if tree else []
    got = subprocess.run(
        [sys.executable, "-m", module, *given, "--child", "calls", "--ops", "200"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    calls: dict[str, Any] = json.loads(got.stdout)
    import dq.storage

    where = tree if tree else Path(dq.storage.__file__).resolve().parents[1]
    print(f"# tree {where}, load {os.getloadavg()[0]:.1f} (counts do not depend on it)")
    return env, given, calls


def print_calls(per_op: Mapping[str, float]) -> None:
    """Python calls per operation: the total, then by module, most first (those of half
    a call or more)."""
    print(f"Python calls: {sum(per_op.values()):.1f}")
    for k, v in sorted(per_op.items(), key=lambda kv: -kv[1]):
        if v >= 0.5:
            print(f"  {k}: {v:.1f}")


def print_split(
    calls: Mapping[str, Mapping[str, float]],
    per_op: Callable[[str], float] | None,
    titles: tuple[str, str],
    heading: str,
) -> None:
    """The enqueue's and the dequeue + release's Python calls per operation and, when
    ``per_op`` counts them under callgrind, their instructions; the dequeue's run enqueued
    its items first, so the enqueue's count is taken off its own. ``heading`` is the
    Markdown heading, with ``{title}`` for each part's title."""
    for part, title in zip(("enqueue", "dequeue"), titles, strict=True):
        print(heading.format(title=title))
        print_calls(calls[part])
        if per_op is None:
            continue
        whole = per_op(part)
        if part == "dequeue":
            whole -= per_op("enqueue")
        print(f"instructions: {whole:,.0f}")


def callgrind(
    module: str, args: Sequence[str], env: Mapping[str, str], *, by_thread: bool = False
) -> dict[int, int]:
    """Instructions (Ir) of one run of ``python -m module *args`` under callgrind: the
    whole process's under 0, or with ``by_thread`` each thread's under its number (1: the
    main thread)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        if by_thread:
            cmd.append("--separate-threads=yes")
        cmd += [sys.executable, "-m", module, *args]
        subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=3600)
        totals: dict[int, int] = {}
        for path in glob.glob(out + "-*") if by_thread else [out]:
            m = _TOTALS.search(Path(path).read_text())
            assert m, "callgrind wrote no totals"
            totals[int(path.rsplit("-", 1)[1]) if by_thread else 0] = int(m.group(1))
        return totals
