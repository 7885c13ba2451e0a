"""What the kernel does for one durable HTTP request on the server, counted instead of
timed: system calls by kind and by thread, context switches, and which threads woke.

Run from the repository root:  .venv/bin/python -m bench.http_syscalls [--ops 300]

The workload is the one ``bench/peers.py``'s ``dq:client-always`` mode times: ``dq
serve --fsync always`` as shipped (shared memory on, every timer at its default), one
``dq.client.Client`` over HTTP on one keep-alive connection, ``--ops`` single enqueues
of 256-byte items, then as many dequeue + release pairs. For each part it prints, per
operation (an enqueue is one request, a dequeue + release two):

- the server's system calls by kind and thread (``strace -f`` attached for the part
  alone; the calls of the threads that tick on a clock whatever the requests are named
  with their thread, so what is per request and what is not can be told apart);
- the voluntary and involuntary context switches of each of its threads
  (``/proc/PID/task/*/status``, read before and after the part, without strace);
- with ``--perf``, each time a thread went to sleep, by what it waited for (its kernel
  stack at the switch, ``perf record -e sched:sched_switch -g``): the next request, a
  lock or the GIL, or one of the device waits of an ``fdatasync`` — the data's
  writeback, the inode's block when the file's size changed, the disk's cache flush;
- the group commits by the thread that ran them (``/metrics``: the loop, ``request``,
  or the syncer thread), to check the loop committed its own writes, as on a fast disk.

Counts depend on neither the load nor the speed of the machine, except where the server
itself reads a clock (its timers, the slow-disk switch, how soon a log uses up its
allocation step, ``storage/prealloc.py``): those are named. Needs strace (and perf for
``--perf``).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.servers import free_port

VALUE = b"v" * 256
_LINE = re.compile(r"^(\d+)\s+([a-z_0-9]+)\(")


def child_serve() -> int:
    """``dq serve`` (its arguments after ``--``), each Python thread's name given to the
    kernel too (``prctl(PR_SET_NAME)``), so ``/proc`` and strace can tell them apart."""
    import ctypes
    import threading

    libc = ctypes.CDLL(None, use_errno=True)
    bootstrap = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    def named(self: threading.Thread) -> None:
        libc.prctl(15, self.name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
        bootstrap(self)

    threading.Thread._bootstrap_inner = named  # type: ignore[attr-defined]
    steps = {}
    prealloc = os.environ.get("DQ_HTTP_SYSCALLS_PREALLOC")
    if prealloc is not None:
        steps["wal_prealloc_bytes"] = int(prealloc)
    prealloc_max = os.environ.get("DQ_HTTP_SYSCALLS_PREALLOC_MAX")
    if prealloc_max is not None:
        steps["wal_prealloc_max_bytes"] = int(prealloc_max)
    if steps:  # the engine's config as the server opens it, but these
        import dataclasses

        from dq.storage import Engine

        opened = Engine.open

        def open_with(path: Any, config: Any = None, *args: Any, **kw: Any) -> Any:
            config = dataclasses.replace(config, **steps)
            return opened(path, config, *args, **kw)

        Engine.open = open_with  # type: ignore[method-assign]
    from dq.cli.main import main as dq_main

    return dq_main(sys.argv[sys.argv.index("--") + 1 :])


def _threads(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (name, voluntary, involuntary context switches, ns on a CPU)."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{task}/status").read_text()
            ns = int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue
        name = re.search(r"^Name:\s+(.*)$", text, re.M)
        vol = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M)
        inv = re.search(r"^nonvoluntary_ctxt_switches:\s+(\d+)", text, re.M)
        assert name and vol and inv
        label = "loop" if int(task) == pid else name.group(1)
        out[int(task)] = (label, int(vol.group(1)), int(inv.group(1)), ns)
    return out


def _commits(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read()
    out = {}
    for line in text.decode().splitlines():
        m = re.match(r'^dq_group_commits_total\{thread="(\w+)"\} (\S+)', line)
        if m:
            out[m.group(1)] = float(m.group(2))
        m = re.match(r"^dq_group_commits_handed_back_total (\S+)", line)
        if m:
            out["handed_back"] = float(m.group(1))
    return out


class Rig:
    def __init__(
        self,
        python: str,
        extra: list[str],
        prealloc: int | None = None,
        prealloc_max: int | None = None,
    ) -> None:
        self.data = tempfile.mkdtemp(prefix="dq-http-syscalls-")
        self.port = free_port()
        cmd = [
            python,
            "-m",
            "bench.http_syscalls",
            "--child",
            "--",
            "serve",
            "--data-dir",
            self.data + "/data",
            "--port",
            str(self.port),
        ]
        cmd += ["--fsync", "always", "--log-level", "warning", *extra]
        env = dict(os.environ)
        if prealloc is not None:
            env["DQ_HTTP_SYSCALLS_PREALLOC"] = str(prealloc)
        if prealloc_max is not None:
            env["DQ_HTTP_SYSCALLS_PREALLOC_MAX"] = str(prealloc_max)
        self.proc = subprocess.Popen(cmd, env=env)
        from dq.client import Client

        give_up = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=5)
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > give_up:
                    raise RuntimeError("the server did not come up") from None
                time.sleep(0.1)
        self.client = Client(f"http://127.0.0.1:{self.port}")
        self.client.put_queue("q")

    def run(self, n: int, part: str) -> None:
        c = self.client
        if part == "enqueue":
            for _ in range(n):
                c.enqueue("q", VALUE)
            return
        for _ in range(n):
            (item,) = c.dequeue("q", count=1, lease_ms=30_000)
            c.release("q", item.id, item.receipt)

    def stop(self) -> None:
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.data, ignore_errors=True)


def _strace(rig: Rig, n: int, part: str) -> collections.Counter[tuple[str, str]]:
    """(thread name, syscall) -> count over ``n`` operations of ``part``."""
    out = os.path.join(rig.data, "strace.out")
    st = subprocess.Popen(["strace", "-f", "-qq", "-o", out, "-p", str(rig.proc.pid)])
    time.sleep(1.0)  # attached to every thread
    names = {tid: t[0] for tid, t in _threads(rig.proc.pid).items()}
    Path(out).write_text("")  # what attaching itself made
    rig.run(n, part)
    st.send_signal(signal.SIGINT)
    st.wait(60)
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in Path(out).read_text().splitlines():
        m = _LINE.match(line)  # a call's end ("<... NAME resumed>") was counted at its start
        if not m or line.split(None, 1)[1].startswith("<..."):
            continue
        counts[(names.get(int(m.group(1)), "?"), m.group(2))] += 1
    return counts


#: what a thread that went to sleep waited for, by a function of its kernel stack
_WAITS = (
    ("file_write_and_wait_range", "fdatasync: the data's writeback"),
    ("__sync_dirty_buffer", "fdatasync: the inode's block (the file's size changed)"),
    ("fsync_buffers_list", "fdatasync: the file's other metadata blocks"),
    ("blkdev_issue_flush", "fdatasync: the disk's cache flush"),
    ("jbd2_log_wait_commit", "fdatasync: a journal commit"),
    ("do_epoll_wait", "epoll_wait: the next request"),
    ("futex_wait", "futex: a lock, the GIL or a condition"),
)


def _sleeps(rig: Rig, n: int, part: str) -> collections.Counter[tuple[str, str]]:
    """(thread name, what it waited for) -> times it went to sleep over ``n`` operations
    of ``part`` (``perf record`` of the scheduler's switches, with kernel stacks)."""
    data = os.path.join(rig.data, "perf.data")
    record = ["perf", "record", "-q", "-e", "sched:sched_switch", "-g", "-o", data]
    perf = subprocess.Popen([*record, "-p", str(rig.proc.pid)])
    time.sleep(1.5)  # attached to every thread
    rig.run(n, part)
    perf.send_signal(signal.SIGINT)
    perf.wait(60)
    text = subprocess.run(
        ["perf", "script", "-i", data, "-F", "tid,trace,ip,sym"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = {tid: t[0] for tid, t in _threads(rig.proc.pid).items()}
    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    for block in text.strip().split("\n\n"):
        head, _, stack = block.strip().partition("\n")
        m = re.search(r"^\s*(\d+)\s.*prev_pid=(\d+) .*prev_state=(\S+)", head)
        if not m or m.group(3).startswith("R"):
            continue  # preempted, not asleep
        what = next((label for fn, label in _WAITS if fn in stack), "other")
        counts[(names.get(int(m.group(2)), "?"), what)] += 1
    return counts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--python", default=sys.executable, help="the venv whose dq serve runs")
    ap.add_argument(
        "--prealloc",
        type=int,
        help="the server's logs grow ahead of their records in steps of this many bytes "
        "first (EngineConfig.wal_prealloc_bytes; default: the engine's own)",
    )
    ap.add_argument(
        "--prealloc-max",
        type=int,
        help="... doubling while a log is hot up to this many (wal_prealloc_max_bytes; "
        "default: the engine's own; the first step or less: fixed steps)",
    )
    ap.add_argument(
        "--perf", action="store_true", help="also what each thread went to sleep for (perf)"
    )
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("serve_args", nargs="*", help="more dq serve arguments")
    args = ap.parse_args()
    if args.child:
        return child_serve()
    rig = Rig(args.python, args.serve_args, args.prealloc, args.prealloc_max)
    n = args.ops
    print(f"# load {os.getloadavg()[0]:.1f}; {n} operations a part (counts, not times)")
    try:
        rig.run(20, "enqueue")
        rig.run(10, "dequeue")
        for part in ("enqueue", "dequeue"):
            c0 = _commits(rig.port)
            t0 = _threads(rig.proc.pid)
            s0 = time.monotonic()
            rig.run(n, part)
            took = time.monotonic() - s0
            t1 = _threads(rig.proc.pid)
            c1 = _commits(rig.port)
            print(f"\n## {part}, per operation ({took / n * 1e6:.0f} µs wall, not a figure)")
            print("group commits:", {k: round((c1[k] - c0.get(k, 0)) / n, 3) for k in c1})
            print("| thread | voluntary | involuntary | CPU µs (not a figure) |")
            print("| --- | ---: | ---: | ---: |")
            for tid, (name, vol, inv, ns) in sorted(t1.items()):
                v0, i0, ns0 = t0.get(tid, (name, 0, 0, 0))[1:]
                if vol - v0 or inv - i0:
                    print(
                        f"| {name} | {(vol - v0) / n:.3f} | {(inv - i0) / n:.3f} "
                        f"| {(ns - ns0) / n / 1000:.1f} |"
                    )
            counts = _strace(rig, n, part)
            print("\n| thread | syscall | per op |\n| --- | --- | ---: |")
            for (name, call), k in sorted(counts.items(), key=lambda x: (x[0][0], -x[1])):
                print(f"| {name} | {call} | {k / n:.3f} |")
            print(f"| all | all | {sum(counts.values()) / n:.3f} |")
            if args.perf:
                sleeps = _sleeps(rig, n, part)
                print("\n| thread | went to sleep for | per op |\n| --- | --- | ---: |")
                for (name, what), k in sorted(sleeps.items(), key=lambda x: (x[0][0], -x[1])):
                    print(f"| {name} | {what} | {k / n:.3f} |")
    finally:
        rig.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
