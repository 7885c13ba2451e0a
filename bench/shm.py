"""Shared-memory benchmark: the command ring beside the HTTP client, in the same run.

Run from the repository root:  .venv/bin/python -m bench.shm [--seconds 2] [--json]

Starts ``dq serve`` with ``DQ_SHM=1`` (once with ``--fsync never``, once with ``always``)
and drives it from worker processes through the public ``Client`` — ``shm:///data-dir``
and ``http://…`` — so each figure is what a user of that transport gets. Values are 256
bytes. Printed, per fsync mode, for 1 and 4 client processes and for both transports:

- single-item enqueue: ops/s and round-trip p50/p99
- dequeue (count 1) + release of one item: items/s and p50/p99 of the pair
- (shm, fsync never, 1 client) a no-op round trip through the ring (``Client.health()``)

and, once: the server process's CPU while 8 shm clients sit attached and idle (and, with
``--idle``, while 8 long-poll an empty queue), and the
floors (the C atomics per call; the engine's own enqueue, in-process, no transport; the
disk's append+fsync rate).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port, stop

REPO = Path(__file__).resolve().parents[1]
VALUE = b"v" * 256


@contextlib.contextmanager
def dq_server(data_dir: Path, fsync: str) -> Iterator[tuple[str, int]]:
    """``dq serve`` with shared memory on; yields (http url, pid)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    env["DQ_SHM"] = "1"  # the default; said here for servers older than that
    cmd = [
        sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(data_dir),
        "--port", str(port), "--fsync", fsync, "--log-level", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while time.monotonic() < give_up:
            if proc.poll() is not None:
                raise RuntimeError(f"dq serve exited with {proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            time.sleep(0.05)
        while not (data_dir / "dq.sock").exists() and time.monotonic() < give_up:
            time.sleep(0.05)
        yield url, proc.pid
    finally:
        stop(proc)


# ---- worker processes -----------------------------------------------------------------------


def worker(url: str, kind: str, seconds: float, queue: str) -> dict[str, Any]:
    from dq.client import Client

    lat: list[float] = []
    with Client(url) as dq:
        clock = time.perf_counter
        started = clock()
        end = started + seconds
        if kind == "ping":  # a no-op round trip through the ring: the transport's floor
            while clock() < end:
                t0 = clock()
                dq.health()
                lat.append(clock() - t0)
        elif kind == "enqueue":
            while clock() < end:
                t0 = clock()
                dq.enqueue(queue, VALUE)
                lat.append(clock() - t0)
        else:
            while clock() < end:
                t0 = clock()
                items = dq.dequeue(queue, 1, 60_000)
                if not items:
                    break
                dq.release(queue, items[0].id, items[0].receipt)
                lat.append(clock() - t0)
        elapsed = clock() - started
    return {"ops": len(lat), "seconds": elapsed, "lat_us": [x * 1e6 for x in lat]}


def run_workers(url: str, kind: str, seconds: float, queue: str, n: int) -> dict[str, Any]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.shm", "--worker", url, kind, str(seconds), queue],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 120)
        results.append(json.loads(out))
    lat = sorted(x for r in results for x in r["lat_us"])
    ops = sum(r["ops"] for r in results)
    wall = max(r["seconds"] for r in results)
    return {
        "ops_s": ops / wall if wall else 0.0,
        "p50_us": lat[len(lat) // 2] if lat else None,
        "p99_us": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else None,
        "ops": ops,
    }


def prefill(url: str, queue: str, count: int) -> None:
    from dq.client import Client

    with Client(url) as dq:
        for start in range(0, count, 1000):
            dq.enqueue_many(queue, [VALUE] * min(1000, count - start))


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


IDLE_CLIENTS = """
import sys, time
from dq.client import Client
clients = [Client(sys.argv[1]) for _ in range(8)]
for c in clients:
    c.health()
print("ready", flush=True)
time.sleep(float(sys.argv[2]))
for c in clients:
    c.close()
"""

#: 8 workers long-polling an empty queue, each its own client and thread: a long-poll
#: over the ring goes as FINDs of at most 250 ms (docs/shm.md), so waiting is not free.
WAITING_CLIENTS = """
import sys, threading, time
from dq.client import Client
clients = [Client(sys.argv[1]) for _ in range(8)]
for c in clients:
    c.health()
end = time.monotonic() + float(sys.argv[2])
def wait(c):
    while time.monotonic() < end:
        c.dequeue("nothing-due", wait_ms=20000)
threads = [threading.Thread(target=wait, args=(c,)) for c in clients]
for t in threads:
    t.start()
print("ready", flush=True)
for t in threads:
    t.join()
for c in clients:
    c.close()
"""


def _cpu_with(script: str, data_dir: Path, pid: int, seconds: float) -> float:
    """The server's CPU, % of one core, over ``seconds`` while ``script`` runs."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, f"shm://{data_dir}", str(seconds + 1.5)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(0.5)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    pct = (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100
    proc.wait(seconds + 60)
    return pct


def idle_cpu(data_dir: Path, pid: int, seconds: float) -> dict[str, float]:
    time.sleep(0.5)
    c0, t0 = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    base = (cpu_seconds(pid) - c0) / (time.monotonic() - t0) * 100
    return {
        "no_clients_pct": base,
        "eight_idle_shm_clients_pct": _cpu_with(IDLE_CLIENTS, data_dir, pid, seconds),
        "eight_waiting_shm_clients_pct": _cpu_with(WAITING_CLIENTS, data_dir, pid, seconds),
    }


def floors() -> dict[str, float]:
    """What no transport can beat: the C atomics' cost per call, and the engine's own
    single-item enqueue (fsync never) called in-process, p50 in us."""
    import mmap
    import timeit

    from dq.shm import _atomics as at
    from dq.storage import Engine, EngineConfig
    from dq.storage.types import NewItem

    mm = mmap.mmap(-1, 4096)
    n = 200_000
    out = {
        "load_u64_ns": timeit.timeit(lambda: at.load_u64(mm, 8), number=n) / n * 1e9,
        "cas_u64_ns": timeit.timeit(lambda: at.cas_u64(mm, 8, 0, 0), number=n) / n * 1e9,
        "memoryview_u64_ns": timeit.timeit(lambda: memoryview(mm)[8:16], number=n) / n * 1e9,
    }
    with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
        engine = Engine.open(Path(tmp) / "data", EngineConfig(fsync="never"))
        lat = []
        for _ in range(5000):
            t0 = time.perf_counter()
            engine.enqueue_nowait("floor", [NewItem(VALUE)]).result()
            lat.append((time.perf_counter() - t0) * 1e6)
        engine.close()
        # the disk's sync rate: what fsync "always" single-client enqueues are bounded by
        fd = os.open(Path(tmp) / "sync-probe", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        syncs, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            os.write(fd, VALUE)
            os.fsync(fd)
            syncs += 1
        out["append_fsync_per_s"] = syncs / (time.perf_counter() - t0)
        os.close(fd)
    lat.sort()
    out["engine_enqueue_p50_us"] = lat[len(lat) // 2]
    out["engine_enqueue_p99_us"] = lat[int(len(lat) * 0.99)]
    return out


# ---- main -------------------------------------------------------------------------------------


def bench(seconds: float) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPU {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "load_avg": os.getloadavg(),
        "results": [],
    }
    report["floors"] = floors()
    print("floors:", json.dumps({k: round(v, 1) for k, v in report["floors"].items()}), flush=True)
    for fsync in ("never", "always"):
        with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
            data = Path(tmp) / "data"
            with dq_server(data, fsync) as (url, pid):
                if fsync == "never":
                    ping = run_workers(f"shm://{data}", "ping", seconds, "-", 1)
                    row = {"fsync": fsync, "clients": 1, "transport": "shm", "op": "no-op ping"}
                    row.update({k: v for k, v in ping.items() if k != "ops"})
                    report["results"].append(row)
                    print_row(row)
                for n in (1, 4):
                    for name, target in (("shm", f"shm://{data}"), ("http", url)):
                        q = f"{name}-{n}"
                        enq = run_workers(target, "enqueue", seconds, q + "-e", n)
                        prefill(url, q + "-d", int(max(enq["ops"], 1000) * 1.5))
                        deq = run_workers(target, "dequeue", seconds, q + "-d", n)
                        for kind, r in (("enqueue", enq), ("dequeue+release", deq)):
                            row = {"fsync": fsync, "clients": n, "transport": name, "op": kind}
                            row.update({k: v for k, v in r.items() if k != "ops"})
                            report["results"].append(row)
                            print_row(row)
                if fsync == "never":
                    report["idle_cpu"] = idle_cpu(data, pid, max(seconds, 5.0))
                    print("server CPU, idle:", json.dumps(report["idle_cpu"]))
    return report


def print_row(row: dict[str, Any]) -> None:
    def us(v: float | None) -> str:
        return "-" if v is None else f"{v:8.0f}"

    print(
        f"fsync={row['fsync']:6} clients={row['clients']} {row['transport']:4} "
        f"{row['op']:16} {row['ops_s']:9.0f} ops/s  p50 {us(row['p50_us'])} us"
        f"  p99 {us(row['p99_us'])} us",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--json", action="store_true", help="print the report as JSON too")
    parser.add_argument("--worker", nargs=4, metavar=("URL", "KIND", "SECONDS", "QUEUE"))
    parser.add_argument(
        "--idle",
        type=float,
        metavar="SECONDS",
        help="only this: the CPU of `dq serve` as shipped (shared memory on, fsync always) "
        "over SECONDS with no client, then with 8 idle shm clients attached, then with 8 "
        "shm clients long-polling an empty queue",
    )
    args = parser.parse_args()
    if args.idle:
        with tempfile.TemporaryDirectory(prefix="dq-bench-") as tmp:
            data = Path(tmp) / "data"
            with dq_server(data, "always") as (_, pid):
                idle = idle_cpu(data, pid, args.idle)
        print(
            f"idle server CPU over {args.idle:.0f} s, % of one core: no client "
            f"{idle['no_clients_pct']:.2f}, 8 idle shm clients "
            f"{idle['eight_idle_shm_clients_pct']:.2f}, 8 shm clients long-polling an empty "
            f"queue {idle['eight_waiting_shm_clients_pct']:.2f}; load average {os.getloadavg()}"
        )
        return
    if args.worker:
        url, kind, secs, queue = args.worker
        print(json.dumps(worker(url, kind, float(secs), queue)))
        return
    print("load average at start:", os.getloadavg(), flush=True)
    report = bench(args.seconds)
    print("load average at end:", os.getloadavg())
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
