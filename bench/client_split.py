"""Where a single ring request's work goes on the *client's* side, counted instead of
timed, so the figures hold on a loaded machine: Python calls by module and instructions
(valgrind's callgrind) of the process that calls ``Client("shm://...")``, per
``enqueue(value)`` and per ``dequeue`` + ``release``.

Run from the repository root:  .venv/bin/python -m bench.client_split [--ops 300] [--tree PATH]

The workload is fixed: ``dq serve --fsync never`` in a process of its own (its work is
``bench/ring_split.py``'s and is not counted here; never, so that a run under callgrind,
tens of times slower, waits on nothing but the client) and, in a child process, the
project's own ``Client`` over its ring: ``--ops`` single ``enqueue(queue, value)`` of
256-byte values, one at a time, then as many ``dequeue(queue)`` of one item each followed
by the ``release`` of what it got. Per operation it prints:

- the client's Python function calls, by module (``sys.setprofile`` in the client
  process, around each part after a warm-up);
- the client process's instructions (callgrind's ``Ir``): a run of 2N operations less a
  run of N, over N, so start-up, imports and the attach cancel out. The kernel's work
  (the futex) is not counted.

``--functions`` prints the calls by function instead of by module. ``--tree PATH``
measures another checkout (a ``git worktree`` of an older commit, its extensions built in
place), so a change is measured before and after on the same machine. Needs
``valgrind``; ``--no-valgrind`` prints the call counts alone.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import counted
from bench.servers import free_port, stop

VALUE = b"v" * 256
#: the server's timers, which would otherwise run during the client's long runs
_QUIET = {"DQ_EXPIRE_INTERVAL_MS": "3600000", "DQ_HISTORY_INTERVAL_MS": "3600000"}


def _run(client: Any, queue: str, n: int, part: str) -> None:
    if part == "enqueue":
        for _ in range(n):
            client.enqueue(queue, VALUE)
        return
    for _ in range(n):
        (item,) = client.dequeue(queue)
        client.release(queue, item.id, item.receipt)


def child_work(url: str, queue: str, n: int, part: str) -> None:
    from dq.client import Client

    with Client(url) as client:
        _run(client, queue, n, "enqueue")
        if part == "dequeue":
            _run(client, queue, n, "dequeue")


def child_calls(url: str, queue: str, n: int, by_function: bool) -> dict[str, dict[str, float]]:
    from dq.client import Client

    counts: collections.Counter[str] = collections.Counter()

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            where = counted.module_of(frame.f_code.co_filename)
            if by_function:
                where += " " + frame.f_code.co_qualname
            counts[where] += 1

    out: dict[str, dict[str, float]] = {}
    with Client(url) as client:
        _run(client, queue, 10, "enqueue")  # warm: the attach, the bind, caches
        _run(client, queue, 10, "dequeue")
        for part in ("enqueue", "dequeue"):
            counts.clear()
            sys.setprofile(prof)
            _run(client, queue, n, part)
            sys.setprofile(None)
            out[part] = {k: v / n for k, v in sorted(counts.items())}
    return out


class _Server:
    """``dq serve --fsync never`` on a fresh data directory, removed at ``close``."""

    def __init__(self) -> None:
        from dq.client import Client

        self.data = tempfile.mkdtemp(prefix="dq-client-split-")
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
        env.update(_QUIET)
        cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", self.data]
        cmd += ["--port", str(port), "--fsync", "never", "--log-level", "warning"]
        self.proc = subprocess.Popen(cmd, env=env)
        give_up = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dq serve exited with {self.proc.returncode}")
            try:
                with Client(f"http://127.0.0.1:{port}", retries=0, timeout=1) as c:
                    c.health()
                    break
            except Exception:
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.1)
        self.url = "shm://" + self.data
        self.queues = 0

    def queue(self) -> str:
        """A queue of its own for each child run (created by its first enqueue)."""
        self.queues += 1
        return f"q{self.queues}"

    def close(self) -> None:
        stop(self.proc)
        shutil.rmtree(self.data, ignore_errors=True)


def main() -> int:
    ap = counted.options(__doc__, 300, "operations", ["work", "calls"])
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--queue", default="q", help=argparse.SUPPRESS)
    ap.add_argument("--functions", action="store_true", help="calls by function")
    args = counted.parse(ap)
    if args.child == "work":
        child_work(args.url, args.queue, args.ops, args.part)
        return 0
    if args.child == "calls":
        print(json.dumps(child_calls(args.url, args.queue, args.ops, args.functions)))
        return 0

    tree = ["--tree", args.tree] if args.tree else []
    where = args.tree or str(Path(__file__).resolve().parents[1])
    print(f"# tree {where}, load {os.getloadavg()[0]:.1f} (counts do not depend on it)")
    env = dict(os.environ, PYTHONHASHSEED="0")
    server = _Server()
    try:
        cmd = [sys.executable, "-m", "bench.client_split", *tree, "--child", "calls"]
        cmd += ["--ops", "200", "--url", server.url, "--queue", server.queue()]
        cmd += ["--functions"] if args.functions else []
        got = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600)
        calls: dict[str, dict[str, float]] = json.loads(got.stdout)
        ir: dict[tuple[int, str], int] = {}

        def instructions(n: int, part: str) -> int:
            if (n, part) not in ir:
                work = [*tree, "--child", "work", "--part", part, "--ops", str(n)]
                work += ["--url", server.url, "--queue", server.queue()]
                ir[(n, part)] = counted.callgrind("bench.client_split", work, env)[0]
            return ir[(n, part)]

        def per_op(part: str) -> float:
            return (instructions(2 * args.ops, part) - instructions(args.ops, part)) / args.ops

        counted.print_split(
            calls,
            None if args.no_valgrind else per_op,
            ("enqueue(value)", "dequeue + release"),
            "\n## {title} over shm://, per operation, client side",
        )
    finally:
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
