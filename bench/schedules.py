"""100,000 schedules on one server: what they cost idle, in memory, at a restart, and how
late they fire under load.

Run from the repository root on a quiet machine (it takes a few minutes):

    .venv/bin/python -m bench.schedules [--schedules 100000] [--queues 100]

It makes two data directories with the same queues (``--queues``, a few items each):
``plain`` without schedules, ``scheduled`` with ``--schedules`` daily cron schedules
spread over the queues (``M H * * *``, minutes and hours at random, every fifth one in
Europe/Berlin: 1,440 distinct expressions, as a real fleet of cron jobs shares a few),
their definition files written directly (``docs/format.md``, ``schedule.<name>.json``),
so the set-up costs seconds, not 100,000 fsynced PUTs. Then, each against a
``dq serve --fsync always`` on a free port:

1. **restart**: the time from starting ``dq serve`` to ``/healthz`` answering 200, for
   each directory (the median of ``--restarts`` starts), and for ``scheduled`` also the
   time until its scheduler has every schedule in its heap (``dq_schedules`` in
   ``/metrics``). Target: ``scheduled`` within 1 s of ``plain``.
2. **idle**: once the scheduler is ready and ``--settle-s`` have passed, the server's
   CPU (``utime + stime`` of every thread, ``/proc``) over ``--idle-s``, as % of one
   core, and its RSS (``VmRSS``) — ``scheduled`` minus ``plain``. Targets: ≤ 1 % of a
   core and ≤ 100 MB more. The daily schedules fire about 70 ticks a minute between
   them, as they would on a real server.
3. **lateness under load**: on the ``scheduled`` server, ``--firing`` more schedules of
   every second (``PUT``, over 10 queues) while ``--producers`` threads enqueue batches
   of 10 (``--rate`` items a second in all) and a consumer dequeues and releases them,
   for ``--load-s``; lateness is the server's own histogram,
   ``dq_schedule_lateness_seconds`` (tick to item durable), read before and after.
   Target: p99 ≤ 50 ms (the histogram's bounds are 5, 10, 25, 50, 100 ms ...; a
   percentile is given as the bound of its bucket).

Everything it prints is also written as JSON to ``--out`` (default
``bench/results/schedules.json``; git ignores ``bench/results/``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.servers import free_port

REPO = Path(__file__).resolve().parents[1]
_TICK = os.sysconf("SC_CLK_TCK")
_BOUNDS = re.compile(r'^dq_schedule_lateness_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.M)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


# ---------------------------------------------------------------------- set-up


def make_data_dir(path: Path, queues: int, schedules: int, seed: int = 1) -> None:
    """Queues with a few items each, and ``schedules`` daily cron schedules over them."""
    from dq.storage import Engine, EngineConfig, NewItem
    from dq.storage.schedule_store import Schedule, encode, file_name
    from dq.storage.schedule_times import Timing

    engine = Engine.open(path, EngineConfig(fsync="never"))
    try:
        now = engine.now()
        rng = random.Random(seed)
        names = [f"jobs-{n:03d}" for n in range(queues)]
        for name in names:
            engine.enqueue(name, [NewItem(b"x" * 100, delay_ms=86_400_000)] * 10)
        for i in range(schedules):
            queue = names[i % queues]
            s = Schedule(
                queue=queue,
                name=f"job-{i:06d}",
                id=rng.getrandbits(63) or 1,
                timing=Timing(
                    cron=f"{rng.randrange(60)} {rng.randrange(24)} * * *",
                    timezone="Europe/Berlin" if i % 5 == 0 else "UTC",
                ),
                value=b'{"job": "nightly"}',
                catch_up="latest",
                paused=False,
                created=now,
                since=now,
            )
            target = Path(engine.queue(queue).directory) / file_name(s.name)
            target.write_text(json.dumps(encode(s), separators=(",", ":")))
    finally:
        engine.close()
    os.sync()


# ---------------------------------------------------------------------- a server


class Server:
    def __init__(self, data_dir: Path, log: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> float:
        """Start ``dq serve``; the seconds until ``/healthz`` answered 200."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
        cmd = [
            sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", str(self.data_dir),
            "--port", str(self.port), "--fsync", "always", "--log-level", "warning",
        ]  # fmt: skip
        started = time.monotonic()
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=out)
        while time.monotonic() - started < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dq serve exited {self.proc.returncode}: see {self.log}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
        self.stop()
        raise RuntimeError(f"dq serve did not answer within {timeout} s")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=30).text
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def wait_scheduler(self, count: int, timeout: float = 600.0) -> None:
        give_up = time.monotonic() + timeout
        while self.metric("dq_schedules") < count:
            if time.monotonic() > give_up:
                raise RuntimeError(f"the scheduler did not hold {count} schedules in time")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


# ---------------------------------------------------------------------- phases


def restart_times(data_dir: Path, log: Path, restarts: int, schedules: int) -> dict[str, float]:
    healthz: list[float] = []
    ready: list[float] = []
    for _ in range(restarts):
        server = Server(data_dir, log)
        started = time.monotonic()
        try:
            healthz.append(server.start())
            if schedules:
                server.wait_scheduler(schedules)
                ready.append(time.monotonic() - started)
        finally:
            server.stop()
    out = {"healthz_s": statistics.median(healthz)}
    if ready:
        out["scheduler_ready_s"] = statistics.median(ready)
    return out


def idle(
    data_dir: Path, log: Path, schedules: int, settle_s: float, idle_s: float
) -> dict[str, float]:
    server = Server(data_dir, log)
    try:
        server.start()
        if schedules:
            server.wait_scheduler(schedules)
        time.sleep(settle_s)
        cpu0, t0 = cpu_seconds(server.pid), time.monotonic()
        time.sleep(idle_s)
        cpu1, t1 = cpu_seconds(server.pid), time.monotonic()
        return {"cpu_pct": 100 * (cpu1 - cpu0) / (t1 - t0), "rss_mb": rss_bytes(server.pid) / 2**20}
    finally:
        server.stop()


def histogram(server: Server) -> dict[float, float]:
    text = httpx.get(server.url + "/metrics", timeout=30).text
    return {float(b): float(n) for b, n in _BOUNDS.findall(text)}


def percentile(before: dict[float, float], after: dict[float, float], p: float) -> float:
    """The upper bound (seconds) of the bucket holding the ``p`` quantile of what was
    observed between two readings of a cumulative histogram (inf past the last)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        raise ValueError("nothing was observed")
    for bound, cumulative in zip(bounds, counts, strict=True):
        if cumulative >= p * total:
            return bound
    return float("inf")


def _produce(url: str, rate: float, stop: threading.Event, sent: list[int]) -> None:
    items = [{"value": "v" * 100}] * 10
    period = 10 / rate
    with httpx.Client(base_url=url, timeout=10) as http:
        nxt = time.monotonic()
        while not stop.is_set():
            http.post("/v1/queues/load/items", json={"items": items}).raise_for_status()
            sent[0] += 10
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))


def _consume(url: str, stop: threading.Event, done: list[int]) -> None:
    receipts: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, timeout=10) as http:
        while not stop.is_set():
            body = {"count": 100, "wait_ms": 200, "release": receipts}
            got = http.post("/v1/queues/load/dequeue", json=body).json()
            receipts = [{"id": i["id"], "receipt": i["receipt"]} for i in got.get("items", [])]
            done[0] += len(receipts)


def lateness(
    data_dir: Path,
    log: Path,
    schedules: int,
    firing: int,
    producers: int,
    rate: float,
    load_s: float,
) -> dict[str, float]:
    server = Server(data_dir, log)
    try:
        server.start()
        server.wait_scheduler(schedules)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            for i in range(firing):
                r = http.put(
                    f"/v1/queues/pulse-{i % 10}/schedules/second-{i}", json={"every_ms": 1000}
                )
                r.raise_for_status()
        stop = threading.Event()
        sent, done = [0], [0]
        threads = [
            threading.Thread(target=_produce, args=(server.url, rate / producers, stop, sent))
            for _ in range(producers)
        ] + [threading.Thread(target=_consume, args=(server.url, stop, done))]
        for t in threads:
            t.start()
        time.sleep(2.0)  # the load runs before the window opens
        before = histogram(server)
        fired0 = server.metric("dq_schedule_ticks_total")
        time.sleep(load_s)
        after = histogram(server)
        fired1 = server.metric("dq_schedule_ticks_total")
        stop.set()
        for t in threads:
            t.join(30)
        return {
            "ticks": fired1 - fired0,
            "p50_ms": 1000 * percentile(before, after, 0.50),
            "p99_ms": 1000 * percentile(before, after, 0.99),
            "load_items_per_s": sent[0] / (load_s + 2.0),
            "released_items_per_s": done[0] / (load_s + 2.0),
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--schedules", type=int, default=100_000)
    ap.add_argument("--queues", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=10.0)
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--firing", type=int, default=200, help="schedules of every second")
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--rate", type=float, default=1000.0, help="items a second, in all")
    ap.add_argument("--load-s", type=float, default=60.0)
    ap.add_argument("--dir", default=None, help="where the data directories go (a temp dir)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results" / "schedules.json"))
    args = ap.parse_args(argv)

    root = Path(args.dir or tempfile.mkdtemp(prefix="dq-bench-schedules-"))
    plain, scheduled = root / "plain", root / "scheduled"
    log = root / "servers.log"
    results: dict[str, Any] = {"schedules": args.schedules, "queues": args.queues}
    try:
        t0 = time.monotonic()
        make_data_dir(plain, args.queues, 0)
        make_data_dir(scheduled, args.queues, args.schedules)
        print(
            f"set-up: {args.queues} queues, {args.schedules:,} schedules in {time.monotonic() - t0:.1f} s"
        )

        r_plain = restart_times(plain, log, args.restarts, 0)
        r_sched = restart_times(scheduled, log, args.restarts, args.schedules)
        results["restart"] = {"plain": r_plain, "scheduled": r_sched}
        extra = r_sched["healthz_s"] - r_plain["healthz_s"]
        print(
            f"restart: /healthz after {r_plain['healthz_s']:.2f} s without schedules, "
            f"{r_sched['healthz_s']:.2f} s with ({extra:+.2f} s; target within 1 s); "
            f"scheduler holding all {args.schedules:,} after {r_sched['scheduler_ready_s']:.2f} s"
        )

        i_plain = idle(plain, log, 0, args.settle_s, args.idle_s)
        i_sched = idle(scheduled, log, args.schedules, args.settle_s, args.idle_s)
        results["idle"] = {"plain": i_plain, "scheduled": i_sched}
        cpu = i_sched["cpu_pct"] - i_plain["cpu_pct"]
        rss = i_sched["rss_mb"] - i_plain["rss_mb"]
        print(
            f"idle: CPU {i_plain['cpu_pct']:.2f} % of a core without, {i_sched['cpu_pct']:.2f} % with "
            f"({cpu:+.2f} %; target <= 1 %); RSS {i_plain['rss_mb']:.0f} MB without, "
            f"{i_sched['rss_mb']:.0f} MB with ({rss:+.0f} MB; target <= 100 MB)"
        )

        late = lateness(
            scheduled, log, args.schedules, args.firing, args.producers, args.rate, args.load_s
        )
        results["lateness"] = late
        print(
            f"lateness under load ({late['load_items_per_s']:.0f} items/s enqueued, "
            f"{late['released_items_per_s']:.0f}/s released): {late['ticks']:.0f} ticks, "
            f"p50 <= {late['p50_ms']:.0f} ms, p99 <= {late['p99_ms']:.0f} ms (target <= 50 ms)"
        )
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"results: {out}")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
