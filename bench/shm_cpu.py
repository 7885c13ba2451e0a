"""Server CPU per single-item request over the shared-memory ring (``Client("shm://…")``).

Run from the repository root:  .venv/bin/python -m bench.shm_cpu [--fsync never] [--seconds 3]

Starts ``dq serve`` on a fresh data directory and a free 127.0.0.1 port, then drives it
from this process through the project's own ``Client`` over ``shm://`` for
``--seconds`` per phase: ``enqueue`` (one 256-byte item per call) and
``dequeue+release`` (a ``count: 1`` dequeue, then its release, as two calls; the
queue is filled first). For each phase it reads the server's ``utime + stime``
(``/proc/<pid>/stat``, every thread) and this process's own CPU before and after, and
prints µs per request (per pair for dequeue+release) and the busiest server thread's
share (the session thread: reading the ring, the engine calls, and with ``--fsync
always`` the group commit it runs itself).

``--fsync never`` leaves the disk out, so the figures are the CPU of the ring, the
session and the engine. ``--tree PATH`` runs the server from another checkout of the
project (e.g. a ``git worktree`` of an older commit; its ``shm/_atomics`` extension
must be built or copied in), so before and after can alternate in one session.
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.servers import free_port

PACKAGES = ("storage", "server", "shm", "client", "cli", "pipeline")
VALUE = b"v" * 256
TICK = os.sysconf("SC_CLK_TCK")


def _tree_path(tree: str) -> str:
    """A directory whose ``dq`` package links to ``tree``'s parts (first on the path)."""
    root = tempfile.mkdtemp(prefix="dq-tree-")
    atexit.register(shutil.rmtree, root, True)
    pkg = Path(root) / "dq"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in PACKAGES:
        if (Path(tree) / name).is_dir():
            (pkg / name).symlink_to(Path(tree).resolve() / name)
    return root


def _threads(pid: int) -> dict[str, int]:
    """CPU ticks (user + system) of each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = int(fields[11]) + int(fields[12])
    return out


def _mine() -> float:
    t = os.times()
    return t.user + t.system


def measure(pid: int, url: str, phase: str, seconds: float) -> str:
    from dq.client import Client

    with Client(url) as c:
        if phase == "dequeue+release":
            for _ in range(int(seconds * 5000)):
                c.enqueue("q", VALUE)
        before, mine, t0, n = _threads(pid), _mine(), time.monotonic(), 0
        end = t0 + seconds
        while time.monotonic() < end:
            for _ in range(100):
                if phase == "enqueue":
                    c.enqueue("q", VALUE)
                else:
                    (item,) = c.dequeue("q", count=1, lease_ms=30_000)
                    c.release("q", item.id, item.receipt)
            n += 100
        elapsed, after, mine = time.monotonic() - t0, _threads(pid), _mine() - mine
    used = {tid: ticks - before.get(tid, 0) for tid, ticks in after.items()}
    total, busiest = sum(used.values()), max(used.values())
    return (
        f"{phase:16} {n / elapsed:8.0f}/s  server {1e6 * total / TICK / n:5.0f} us"
        f" (session thread {1e6 * busiest / TICK / n:4.0f})  client {1e6 * mine / n:4.0f} us"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsync", default="never", choices=["never", "always"])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--tree", help="run the server from the project checked out at this path")
    args = ap.parse_args()
    data = tempfile.mkdtemp(prefix="dq-shm-cpu-")
    env = dict(os.environ)
    if args.tree:
        env["PYTHONPATH"] = _tree_path(args.tree)
    dq = str(Path(sys.executable).with_name("dq"))
    cmd = [dq, "serve", "--data-dir", f"{data}/data", "--host", "127.0.0.1"]
    cmd += ["--port", str(free_port()), "--fsync", args.fsync]
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        sock, end = Path(data, "data", "dq.sock"), time.monotonic() + 30
        while not sock.exists():
            if time.monotonic() > end or server.poll() is not None:
                raise SystemExit("the server did not open its shared-memory socket")
            time.sleep(0.05)
        time.sleep(0.3)
        for phase in ("enqueue", "dequeue+release"):
            print(measure(server.pid, f"shm://{data}/data", phase, args.seconds), flush=True)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        shutil.rmtree(data, ignore_errors=True)


if __name__ == "__main__":
    main()
