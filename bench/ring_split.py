"""Where a single durable ring request's work goes on the server, counted instead of timed,
so the figures hold on a loaded machine: Python calls by module and instructions
(valgrind's callgrind), per PUT and per FIND + DELETE.

Run from the repository root:  .venv/bin/python -m bench.ring_split [--ops 300] [--tree PATH]

The workload is fixed: a shared-memory server (``shm/server.py``) in this process on an
engine with ``fsync always`` (its syncer thread commits, as in service), one client ring
(``ClientRing``, in the main thread) bound to queue "q", ``--ops`` single PUTs of
256-byte items, one at a time, then as many FINDs of one item each followed by the
DELETE of what it got. The server's side is every thread but the main one (the session
thread, the syncer that makes a write durable and answers it, the control thread). Per
request it prints:

- Python function calls on the server's side, by module (``threading.setprofile``), and
  the voluntary context switches of its threads (``/proc/self/task/*/status``: a thread
  going to sleep to be woken by another; the client waits on the ring between requests,
  so on a quiet or a loaded machine the count per request is the same);
- instructions on the server's side (callgrind ``--separate-threads``: every thread but
  the first) and of the whole process, each as a run of 2N less a run of N, over N, so
  start-up cancels out. The fsync's own work is the kernel's and is not counted.

``--tree PATH`` measures another checkout (e.g. a ``git worktree`` of an older commit,
its extensions built in place), so a change is measured before and after on the same
machine. Needs ``valgrind``; ``--no-valgrind`` prints the call counts alone.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from bench import counted

VALUE = b"v" * 256


class _Rig:
    """An engine, a shared-memory server on it, and one attached client ring."""

    def __init__(self) -> None:
        from dq.shm.attach import attach
        from dq.shm.command_ring import ClientRing
        from dq.shm.server import ShmServer
        from dq.storage import Engine, EngineConfig

        self.data = tempfile.mkdtemp(prefix="dq-ring-split-")
        self.engine = Engine.open(self.data, EngineConfig(fsync="always", auto_merge=False))
        self.engine.ensure_queue("q")
        self.server = ShmServer(self.engine, self.data).start()
        self.attachment = attach(self.data, queue="q", capacity=64)
        self.ring = ClientRing(self.attachment.mm, spin_us=0.0)

    def run(self, n: int, part: str) -> None:
        from dq.shm import command_codec as codec
        from dq.shm.command_ring import Op, Status

        call = self.ring.call
        if part == "enqueue":
            key = codec.encode_put(None, None)
            for _ in range(n):
                assert call(Op.PUT, key, VALUE).status == Status.OK
            return
        find = codec.encode_find(1, 0, None)
        for _ in range(n):
            got = call(Op.FIND, find, b"")
            ((item_id, receipt, *_),) = codec.delivery_fields(got.body)
            assert call(Op.DELETE, *codec.encode_item(item_id, receipt)).status == Status.OK

    def close(self) -> None:
        self.ring.close()
        self.attachment.close()
        self.server.close()
        self.engine.close()
        shutil.rmtree(self.data, ignore_errors=True)


def child_work(n: int, part: str) -> None:
    rig = _Rig()
    try:
        rig.run(n, "enqueue")
        if part == "dequeue":
            rig.run(n, "dequeue")
    finally:
        rig.close()


def _switches() -> int:
    """Voluntary context switches so far of this process's threads but the main one
    (``/proc/self/task``): each is a thread going to sleep, to be woken by another."""
    main = threading.get_native_id()
    total = 0
    for task in os.listdir("/proc/self/task"):
        if int(task) == main:
            continue
        try:
            text = Path(f"/proc/self/task/{task}/status").read_text()
        except FileNotFoundError:
            continue
        m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M)
        total += int(m.group(1)) if m else 0
    return total


def child_calls(n: int) -> dict[str, dict[str, float]]:
    """Per request of each part: the server's Python calls, by module, and its threads'
    voluntary context switches (``(context switches)``)."""
    main = threading.get_ident()
    counts: collections.Counter[str] = collections.Counter()
    counting = [False]

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not counting[0] or threading.get_ident() == main:
            return
        counts[counted.module_of(frame.f_code.co_filename)] += 1

    threading.setprofile(prof)  # the threads the rig starts: syncer, control, session
    rig = _Rig()
    out: dict[str, dict[str, float]] = {}
    try:
        rig.run(10, "enqueue")  # warm: first calls import and cache
        rig.run(10, "dequeue")
        for part in ("enqueue", "dequeue"):
            counts.clear()
            switches = _switches()
            counting[0] = True
            rig.run(n, part)
            counting[0] = False
            out[part] = {k: v / n for k, v in sorted(counts.items())}
            out[part]["(context switches)"] = (_switches() - switches) / n
    finally:
        rig.close()
    return out


def _callgrind(args: list[str], env: dict[str, str]) -> tuple[int, int]:
    """Instructions (Ir) of one run under callgrind: (server threads, whole process)."""
    per_thread = counted.callgrind("bench.ring_split", args, env, by_thread=True)
    assert 1 in per_thread, "no main thread in callgrind's output"
    whole = sum(per_thread.values())
    return whole - per_thread[1], whole


def main() -> int:
    ap = counted.options(__doc__, 300, "requests", ["work", "calls"])
    args = counted.parse(ap)
    if args.child == "work":
        child_work(args.ops, args.part)
        return 0
    if args.child == "calls":
        print(json.dumps(child_calls(args.ops)))
        return 0

    env, tree, calls = counted.begin("bench.ring_split", args.tree)
    measured: dict[tuple[str, int], tuple[int, int]] = {}

    def run(part: str, n: int) -> tuple[int, int]:
        if (part, n) not in measured:
            work = [*tree, "--child", "work", "--part", part, "--ops", str(n)]
            measured[(part, n)] = _callgrind(work, env)
        return measured[(part, n)]

    for part, title in (("enqueue", "single durable PUT"), ("dequeue", "FIND + DELETE")):
        c = calls[part]
        switches = c.pop("(context switches)")
        print(f"\n## {title}, per request, server side")
        print(f"voluntary context switches of the server's threads: {switches:.2f}")
        counted.print_calls(c)
        if args.no_valgrind:
            continue
        n = args.ops
        one, two = run(part, n), run(part, 2 * n)
        server = (two[0] - one[0]) / n
        whole = (two[1] - one[1]) / n
        if part == "dequeue":  # its share: less the run of enqueues alone
            e1, e2 = run("enqueue", n), run("enqueue", 2 * n)
            server -= (e2[0] - e1[0]) / n
            whole -= (e2[1] - e1[1]) / n
        print(f"instructions: server side {server:,.0f}, whole process {whole:,.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
