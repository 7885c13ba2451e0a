"""Server CPU per single-item request: durable enqueue, dequeue, release, dequeue+release.

Run from the repository root:  .venv/bin/python -m bench.server_cpu [--requests 3000]

Starts ``dq serve --fsync always`` on a free port (or measures ``--pid`` at ``--url``),
then drives it from ``--clients`` processes, each with one keep-alive
``http.client`` connection (the leanest client the standard library has, so the
clients leave the server CPU to work with). For each phase it reads the server's
``utime + stime`` (all its threads, ``/proc/<pid>/stat``) before and after, once every
client is connected and waiting at a barrier, and prints CPU µs per request:

- ``enqueue``: one item of 256 bytes per request, durable (group commit)
- ``dequeue``: ``count: 1`` of a filled queue
- ``release``: ``/release`` of one delivery
- ``dequeue+release``: one request that releases the previous delivery and leases
  the next (``"release"`` in the dequeue body), the one-round-trip worker loop

Each line also gives the part spent on the event loop thread (the rest is the engine's
syncer thread writing and fsyncing the log, and the engine's helpers) and the loop
thread's context switches per request (``/proc/<pid>/task/<pid>/status``): waits for
the GIL the syncer holds, and wake-ups, are what a durable request's hand-off costs.

``--split`` runs the server under ``bench/loop_split.py`` (CPU probes on the loop
thread) and prints, per phase, the loop thread's µs per request in parsing and
dispatch, durable answers, answer writes and the engine's calls. The probes cost a few
µs a call, so take the whole-process figures from a run without ``--split``.

``--vary V`` enqueues values of 256 - V to 256 + V bytes in turn, so the request bodies
(and their ``Content-Length``) differ, as a web application's do.

``--batch N`` sends N items per request instead (enqueue N items, dequeue ``count: N``,
release N deliveries, and the combined request with N of each) and prints µs per item
as well: what a batch of 100 costs the server item by item.

``DQ_FAST_PATH=0`` in the environment measures the FastAPI routes instead of the fast
path; ``--command`` runs another server command line (e.g. an older checkout's).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.servers import free_port

VALUE = "v" * 256
_TICK = os.sysconf("SC_CLK_TCK")
_JSON = {"content-type": "application/json"}


def cpu_seconds(pid: int, thread: int | None = None) -> float:
    """utime + stime of every thread of ``pid`` (or of one ``thread``)."""
    path = f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat"
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def switches(pid: int) -> int:
    """Voluntary + involuntary context switches of thread ``pid`` of ``pid`` so far."""
    total = 0
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if "ctxt_switches:" in line:
            total += int(line.split()[-1])
    return total


class Split:
    """Reads the loop thread's CPU split from a server run under ``bench/loop_split.py``."""

    def __init__(self, pid: int, path: Path) -> None:
        self.pid = pid
        self.path = path

    def read(self) -> dict[str, list[float]]:
        self.path.unlink(missing_ok=True)
        os.kill(self.pid, signal.SIGUSR1)
        give_up = time.monotonic() + 10
        while not self.path.exists():
            if time.monotonic() > give_up:
                raise RuntimeError("the server wrote no split (not run under bench.loop_split?)")
            time.sleep(0.01)
        table: dict[str, list[float]] = json.loads(self.path.read_text())
        return table


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> Any:
    conn.request("POST", path, body, _JSON)
    r = conn.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:200]!r}")
    return json.loads(data)


def _worker(
    port: int,
    phase: str,
    queue: str,
    n: int,
    barrier: Any,
    out: Any,
    receipts: list[Any],
    batch: int = 1,
    vary: int = 0,
) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    conn.connect()
    base = f"/v1/queues/{queue}"
    # values of 256 bytes, or of 256 - vary .. 256 + vary bytes in turn
    enqueues = [
        json.dumps({"items": [{"value": VALUE[: len(VALUE) - vary] + "v" * k}] * batch}).encode()
        for k in range(2 * vary + 1)
    ]
    one = json.dumps({"count": batch}).encode()
    barrier.wait()
    got: list[Any] = []
    if phase == "enqueue":
        step = 7919 % len(enqueues) or 1  # each client its own order of lengths
        start = os.getpid()
        for k in range(n):
            _post(conn, base + "/items", enqueues[(start + k * step) % len(enqueues)])
    elif phase == "dequeue":
        for _ in range(n):
            got += [(i["id"], i["receipt"]) for i in _post(conn, base + "/dequeue", one)["items"]]
    elif phase == "release":
        for at in range(0, len(receipts), batch):
            chunk = [{"id": i, "receipt": r} for i, r in receipts[at : at + batch]]
            _post(conn, base + "/release", json.dumps({"items": chunk}).encode())
    else:  # dequeue+release
        previous: list[dict[str, Any]] = []
        for _ in range(n):
            body = json.dumps({"count": batch, "release": previous}).encode()
            items = _post(conn, base + "/dequeue", body)["items"]
            previous = [{"id": i["id"], "receipt": i["receipt"]} for i in items]
        if previous:
            _post(conn, base + "/release", json.dumps({"items": previous}).encode())
    barrier.wait()
    out.put(got)
    conn.close()


def run_phase(
    pid: int,
    port: int,
    phase: str,
    queue: str,
    n: int,
    clients: int,
    receipts: list[Any],
    split: Split | None = None,
    batch: int = 1,
    vary: int = 0,
) -> tuple[float, list[Any]]:
    """CPU µs per request of one phase, and the receipts it collected."""
    barrier = mp.Barrier(clients + 1)
    out: Any = mp.Queue()
    share = [receipts[k::clients] for k in range(clients)]
    procs = [
        mp.Process(
            target=_worker,
            args=(port, phase, queue, n // clients, barrier, out, share[k], batch, vary),
        )
        for k in range(clients)
    ]
    for p in procs:
        p.start()
    s0 = split.read() if split else {}  # no client sends before the barrier opens
    x0 = switches(pid)
    barrier.wait()
    t0, c0, l0 = time.perf_counter(), cpu_seconds(pid), cpu_seconds(pid, pid)
    barrier.wait()
    c1, l1, t1 = cpu_seconds(pid), cpu_seconds(pid, pid), time.perf_counter()
    x1 = switches(pid)
    s1 = split.read() if split else {}
    got: list[Any] = []
    for _ in procs:
        got += out.get(timeout=60)
    for p in procs:
        p.join(30)
    if phase == "release":
        requests = sum(-(-len(part) // batch) for part in share)
        items = len(receipts)
    else:
        requests = (n // clients) * clients
        items = len(got) if phase == "dequeue" else requests * batch
    per_item = (
        f"{(c1 - c0) / max(items, 1) * 1e6:6.1f} µs CPU/item "
        f"({(l1 - l0) / max(items, 1) * 1e6:.1f} on the loop, {items} items), "
        if batch > 1
        else ""
    )
    print(
        f"{phase:>16}: {per_item}{(c1 - c0) / requests * 1e6:7.1f} µs CPU/request, "
        f"{(l1 - l0) / requests * 1e6:6.1f} of it on the event loop thread "
        f"({requests} requests, {requests / (t1 - t0):6.0f} req/s, {clients} clients, "
        f"{(x1 - x0) / requests:.1f} loop-thread context switches a request)",
        flush=True,
    )
    if split:
        parts = ", ".join(
            f"{name} {(s1[name][0] - s0[name][0]) / requests * 1e6:.1f}"
            for name in s1
            if s1[name][1] > s0[name][1]
        )
        print(f"{'':>18}loop thread, µs a request: {parts}", flush=True)
    return (c1 - c0) / requests * 1e6, got


def _fill(port: int, queue: str, n: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for start in range(0, n, 500):
        items = [{"value": VALUE}] * min(500, n - start)
        _post(conn, f"/v1/queues/{queue}/items", json.dumps({"items": items}).encode())
    conn.close()


def _wait_up(port: int, proc: subprocess.Popen[bytes] | None, timeout: float = 60) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("server did not come up")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000, help="per phase")
    ap.add_argument("--clients", type=int, default=4, help="client processes")
    ap.add_argument("--fsync", default="always")
    ap.add_argument("--batch", type=int, default=1, help="items per request")
    ap.add_argument(
        "--vary",
        type=int,
        default=0,
        help="enqueue values of 256 +- VARY bytes in turn (bodies of many lengths)",
    )
    ap.add_argument("--command", help="server command line; {port} and {data} are filled in")
    ap.add_argument("--pid", type=int, help="measure a running server (with --port)")
    ap.add_argument("--port", type=int)
    ap.add_argument(
        "--split",
        action="store_true",
        help="probe where the loop thread's CPU goes (bench/loop_split.py)",
    )
    ap.add_argument(
        "--no-combined",
        action="store_true",
        help="skip dequeue+release (a server from before releases rode on dequeue)",
    )
    args = ap.parse_args()

    data = tempfile.mkdtemp(prefix="dq-cpu-")
    proc = None
    split = None
    try:
        if args.pid:
            pid, port = args.pid, args.port
        else:
            port = free_port()
            dq = str(Path(sys.executable).parent / "dq")
            if args.split:
                dq = f"{sys.executable} -m bench.loop_split"
            default = f"{dq} serve --data-dir {{data}} --port {{port}} --fsync {args.fsync}"
            command = (args.command or default).format(port=port, data=data)
            if args.command is None:
                command += " --log-level warning"
            env = {**os.environ, "DQ_LOOP_SPLIT": data + "-split.json"}
            repo = Path(__file__).resolve().parents[1]
            proc = subprocess.Popen(shlex.split(command), env=env, cwd=repo)
            pid = proc.pid
        _wait_up(port, proc)
        if args.split:
            split = Split(pid, Path(data + "-split.json"))
        load = os.getloadavg()
        print(
            f"server pid {pid}, fsync={args.fsync}, fast path "
            f"{'off' if os.environ.get('DQ_FAST_PATH') == '0' else 'on'}, "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, {os.cpu_count()} CPUs",
            flush=True,
        )
        n, c, b = args.requests, args.clients, args.batch
        v = args.vary
        run_phase(pid, port, "enqueue", "cpu", n, c, [], split, b, v)  # creates the queue, warms up
        run_phase(pid, port, "enqueue", "cpu", n, c, [], split, b, v)
        _, got = run_phase(pid, port, "dequeue", "cpu", n, c, [], split, b)
        run_phase(pid, port, "release", "cpu", n, c, got, split, b)
        if not args.no_combined:
            _fill(port, "cpu", (n + c) * b)
            run_phase(pid, port, "dequeue+release", "cpu", n, c, [], split, b)
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(data, ignore_errors=True)
        Path(data + "-split.json").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
