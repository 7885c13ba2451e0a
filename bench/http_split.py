"""Where a single durable HTTP request's work goes on the server, counted instead of timed,
so the figures hold on a loaded machine: Python calls by module and instructions
(valgrind's callgrind), per single enqueue and per dequeue + release.

Run from the repository root:  .venv/bin/python -m bench.http_split [--ops 300] [--tree PATH]

The workload is fixed: ``dq serve --fsync always`` (the fast path on, the event loop
committing its own writes, as in service; without the ring's threads, and with the lease
expiry and the history sampler once an hour, so that the timers' work, which grows with
the run's length, is not counted as the requests') driven by one ``http.client`` keep-alive
connection from this process: ``--ops`` single enqueues of 256-byte items
(``POST /v1/queues/q/items``), then as many ``POST .../dequeue {"count": 1}`` each
followed by ``POST .../release`` of what it got. Per operation it prints:

- the server's Python function calls, by module (``sys.setprofile`` and
  ``threading.setprofile`` in the server process, read before and after each part);
- the server process's instructions (callgrind's ``Ir``, all its threads): a run of 2N
  operations less a run of N, over N, so start-up and shutdown cancel out. The kernel's
  work (the socket, the fsync) is not counted.

``--tree PATH`` measures another checkout (a ``git worktree`` of an older commit, its
extensions built in place), so a change is measured before and after on the same
machine. Needs ``valgrind``; ``--no-valgrind`` prints the call counts alone.
"""

from __future__ import annotations

import argparse
import collections
import glob
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench import counted
from bench.servers import free_port

BODY = json.dumps({"items": [{"value": "v" * 256}]}).encode()
_JSON = {"content-type": "application/json"}
#: Work the server does on a timer, whatever the requests, which a run under callgrind
#: (tens of times slower) would count per request: the ring's threads (``--no-shm``: the
#: HTTP path alone), the lease expiry and the history sampler (once an hour).
_QUIET = {
    "DQ_SHM": "0",
    "DQ_EXPIRE_INTERVAL_MS": "3600000",
    "DQ_HISTORY_INTERVAL_MS": "3600000",
    "DQ_HISTORY_RETENTION_S": "3600",
}
#: the server's threads that wake on a timer, whatever the requests: left out
_TICKING = frozenset(
    {"dq-telemetry", "dq-submission-drain", "dq-broadcast", "dq-maintenance", "dq-shm-control"}
)


def child_serve() -> int:
    """``dq serve`` (its arguments after ``--``); with ``$DQ_HTTP_SPLIT`` set, with a call
    counter: SIGUSR1 writes the counts so far to that file as JSON."""
    counts: collections.Counter[str] = collections.Counter()
    by_function = bool(os.environ.get("DQ_HTTP_SPLIT_FUNCTIONS"))
    skip: dict[int, bool] = {}

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event != "call":
            return
        me = threading.get_ident()
        if me not in skip:  # threads that tick on their own clock, not per request
            skip[me] = threading.current_thread().name in _TICKING
        if skip[me]:
            return
        where = counted.module_of(frame.f_code.co_filename)
        if by_function:
            where += " " + frame.f_code.co_qualname
        counts[where] += 1

    def dump(_signum: int, _frame: Any) -> None:
        out = Path(os.environ["DQ_HTTP_SPLIT"])
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(dict(counts)))
        tmp.replace(out)

    from dq.cli.main import main as dq_main

    if os.environ.get("DQ_HTTP_SPLIT"):
        signal.signal(signal.SIGUSR1, dump)
        threading.setprofile(prof)
        sys.setprofile(prof)
    return dq_main(sys.argv[sys.argv.index("--") + 1 :])


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> Any:
    conn.request("POST", path, body, _JSON)
    r = conn.getresponse()
    data = r.read()
    assert r.status == 200, (r.status, data)
    return json.loads(data)


def _run(conn: http.client.HTTPConnection, n: int, part: str) -> None:
    if part == "enqueue":
        for _ in range(n):
            _post(conn, "/v1/queues/q/items", BODY)
        return
    for _ in range(n):
        (item,) = _post(conn, "/v1/queues/q/dequeue", b'{"count": 1}')["items"]
        release = {"items": [{"id": item["id"], "receipt": item["receipt"]}]}
        _post(conn, "/v1/queues/q/release", json.dumps(release).encode())


class _Server:
    """A server process (under ``prefix``, e.g. valgrind), its data dir removed at exit."""

    def __init__(self, tree: list[str], prefix: list[str], counting: bool) -> None:
        self.data = tempfile.mkdtemp(prefix="dq-http-split-")
        self.port = free_port()
        self.out = Path(self.data + "-calls.json")
        serve = ["serve", "--data-dir", self.data, "--port", str(self.port)]
        serve += ["--fsync", "always", "--log-level", "warning"]
        cmd = [sys.executable, "-m", "bench.http_split", *tree, "--child", "serve", "--"]
        env = dict(os.environ, PYTHONHASHSEED="0", DQ_HTTP_SPLIT=str(self.out) if counting else "")
        env.update(_QUIET)
        self.proc = subprocess.Popen([*prefix, *cmd, *serve], env=env)
        give_up = time.monotonic() + 600
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    break
            except OSError:
                pass
            if time.monotonic() > give_up:
                raise RuntimeError("server did not come up")
            time.sleep(0.2)
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def calls(self) -> collections.Counter[str]:
        self.out.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        give_up = time.monotonic() + 60
        while not self.out.exists():
            if time.monotonic() > give_up:
                raise RuntimeError("the server wrote no counts")
            time.sleep(0.05)
        return collections.Counter(json.loads(self.out.read_text()))

    def stop(self) -> None:
        self.conn.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(600)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        shutil.rmtree(self.data, ignore_errors=True)
        self.out.unlink(missing_ok=True)


def calls_per_op(tree: list[str], n: int) -> dict[str, dict[str, float]]:
    server = _Server(tree, [], counting=True)
    out: dict[str, dict[str, float]] = {}
    try:
        _run(server.conn, 10, "enqueue")  # warm: the queue's creation, first imports
        _run(server.conn, 10, "dequeue")
        for part in ("enqueue", "dequeue"):
            before = server.calls()
            _run(server.conn, n, part)
            after = server.calls()
            after.subtract(before)
            out[part] = {k: v / n for k, v in after.items() if v}
    finally:
        server.stop()
    return out


def _instructions(tree: list[str], n: int, part: str) -> int:
    """The server's instructions for a run of ``n`` of ``part`` (after ``n`` enqueues
    for "dequeue"), start-up and shutdown included."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cg.out")
        prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
        server = _Server(tree, prefix, counting=False)
        try:
            _run(server.conn, n, "enqueue")
            if part == "dequeue":
                _run(server.conn, n, "dequeue")
        finally:
            server.stop()
        total = 0
        for path in glob.glob(out + "*"):
            m = re.search(r"^(?:summary|totals): (\d+)", Path(path).read_text(), re.M)
            assert m, "callgrind wrote no totals"
            total += int(m.group(1))
        return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=300, help="operations of each part (N)")
    ap.add_argument("--tree", help="measure the project checked out at this path")
    ap.add_argument("--no-valgrind", action="store_true", help="call counts only")
    ap.add_argument("--functions", action="store_true", help="calls by function")
    ap.add_argument("--child", choices=["serve"], help=argparse.SUPPRESS)
    args, _rest = ap.parse_known_args()
    if args.tree:
        from bench.engine_cpu import _use_tree

        _use_tree(args.tree)
    if args.child == "serve":
        return child_serve()
    tree = ["--tree", args.tree] if args.tree else []
    if args.functions:
        os.environ["DQ_HTTP_SPLIT_FUNCTIONS"] = "1"
    where = args.tree or str(Path(__file__).resolve().parents[1])
    print(f"# tree {where}, load {os.getloadavg()[0]:.1f} (counts do not depend on it)")
    calls = calls_per_op(tree, 200)
    n = args.ops
    ir: dict[tuple[int, str], int] = {}

    def per_op(part: str) -> float:
        for k in (n, 2 * n):
            if (k, part) not in ir:
                ir[(k, part)] = _instructions(tree, k, part)
        return (ir[(2 * n, part)] - ir[(n, part)]) / n

    counted.print_split(
        calls,
        None if args.no_valgrind else per_op,
        ("durable single enqueue", "dequeue + release"),
        "\n## {title}, per operation (two requests for dequeue + release)",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
