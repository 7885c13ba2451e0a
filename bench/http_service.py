"""HTTP service benchmark: the HTTP figures of docs/performance.md, beside a bare FastAPI floor.

Run from the repository root:  .venv/bin/python -m bench.http_service [--seconds 3] [--json]

Starts ``dq serve --fsync always`` and a bare FastAPI+pydantic app (a POST that parses
the same body and does nothing) as separate uvicorn processes with the same settings,
and drives both from this process with a small raw HTTP/1.1 keep-alive client on
uvloop (cheaper per request than any Python HTTP library, so the load generator is not
what saturates first). Values are 256 bytes. Printed:

- single-item enqueue req/s at concurrency 1 and 32 (and the bare floor at both)
- batch-of-100 enqueue items/s
- single-item dequeue+release items/s, batched (100) dequeue+release items/s
- long-poll wake-up latency p50/p99: (a) after a delayed item's deadline passes,
  (b) after an enqueue is acknowledged while a consumer waits
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import uvloop

from bench.servers import free_port, stop

REPO = Path(__file__).resolve().parents[1]
VALUE = "v" * 256

BARE_APP = """
import sys, uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

class Item(BaseModel):
    value: str
    encoding: str = "utf-8"
    deadline: int | None = None
    delay_ms: int | None = None

class Body(BaseModel):
    items: list[Item]

app = FastAPI()

@app.post("/noop")
async def noop(body: Body) -> dict[str, bool]:
    return {"ok": True}

uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, server_header=False)
"""


# --------------------------------------------------------------------------- client


class Conn:
    """One keep-alive HTTP/1.1 connection; requests are sent one at a time."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str
    ) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer, f"127.0.0.1:{port}")

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        return await self.request("POST", path, body)

    async def request(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw[9:12])
        length = 0
        for line in raw.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
                break
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def _items_body(n: int, **when: int) -> bytes:
    item = {"value": VALUE, **when}
    return json.dumps({"items": [item] * n}).encode()


async def _run_for(
    seconds: float, conns: list[Conn], step: Callable[[Conn], Awaitable[int]]
) -> tuple[float, int, int]:
    """Run ``step`` in a loop on every connection for ``seconds``; (elapsed, calls, units)."""
    stop = time.perf_counter() + seconds
    calls = units = 0

    async def worker(c: Conn) -> None:
        nonlocal calls, units
        while time.perf_counter() < stop:
            n = await step(c)  # not `units += await ...`: that reads units before awaiting
            units += n
            calls += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in conns))
    return time.perf_counter() - t0, calls, units


async def _conns(port: int, n: int) -> list[Conn]:
    return [await Conn.open(port) for _ in range(n)]


def _check(status: int, body: bytes) -> None:
    if status != 200:
        raise RuntimeError(f"HTTP {status}: {body[:200]!r}")


# --------------------------------------------------------------------------- phases


async def bare(port: int, concurrency: int, seconds: float) -> float:
    body = _items_body(1)

    async def step(c: Conn) -> int:
        _check(*await c.post("/noop", body))
        return 1

    conns = await _conns(port, concurrency)
    await _run_for(0.5, conns, step)  # warm-up
    elapsed, calls, _ = await _run_for(seconds, conns, step)
    for c in conns:
        c.close()
    return calls / elapsed


async def enqueue(port: int, concurrency: int, batch: int, seconds: float) -> float:
    body = _items_body(batch, delay_ms=3_600_000)  # delayed: does not feed the dequeue phases
    path = f"/v1/queues/bench-enqueue-{batch}/items"

    async def step(c: Conn) -> int:
        _check(*await c.post(path, body))
        return batch

    conns = await _conns(port, concurrency)
    await _run_for(0.5, conns, step)
    elapsed, _, units = await _run_for(seconds, conns, step)
    for c in conns:
        c.close()
    return units / elapsed


async def fill(port: int, queue: str, n: int) -> None:
    body = _items_body(500)
    conns = await _conns(port, 4)
    todo = n // 500

    async def worker(c: Conn) -> None:
        nonlocal todo
        while todo > 0:
            todo -= 1
            _check(*await c.post(f"/v1/queues/{queue}/items", body))

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()


async def dequeue_release(
    port: int, queue: str, concurrency: int, count: int, seconds: float
) -> float:
    deq = json.dumps({"count": count, "lease_ms": 60_000}).encode()

    async def step(c: Conn) -> int:
        status, raw = await c.post(f"/v1/queues/{queue}/dequeue", deq)
        _check(status, raw)
        items = json.loads(raw)["items"]
        if not items:
            raise RuntimeError(f"queue {queue} ran dry: fill more or run shorter")
        rel = json.dumps({"items": [{"id": i["id"], "receipt": i["receipt"]} for i in items]})
        status, raw = await c.post(f"/v1/queues/{queue}/release", rel.encode())
        _check(status, raw)
        return len(items)

    conns = await _conns(port, concurrency)
    elapsed, _, units = await _run_for(seconds, conns, step)
    for c in conns:
        c.close()
    return units / elapsed


def _pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


async def wakeup(port: int, samples: int) -> dict[str, float]:
    """(a) deadline → response received; (b) enqueue sent → long-poll response received
    (this one includes the enqueue's own fsync: items are published once durable)."""
    waiter, producer = await Conn.open(port), await Conn.open(port)
    poll = json.dumps({"count": 1, "wait_ms": 20_000, "lease_ms": 60_000}).encode()
    _check(*await producer.request("PUT", "/v1/queues/bench-wake", b"{}"))
    due_lag: list[float] = []
    push_lag: list[float] = []
    for n in range(samples):
        timed = n % 2 == 0
        task = asyncio.create_task(waiter.post("/v1/queues/bench-wake/dequeue", poll))
        await asyncio.sleep(0.01)  # the poll is parked on the server
        body = _items_body(1, delay_ms=30) if timed else _items_body(1)
        sent = time.time() * 1000
        status, raw = await producer.post("/v1/queues/bench-wake/items", body)
        _check(status, raw)
        status, got = await task
        received = time.time() * 1000
        _check(status, got)
        item = json.loads(got)["items"][0]
        if timed:
            due_lag.append(received - item["deadline"])
        else:
            push_lag.append(received - sent)
        rel = json.dumps({"items": [{"id": item["id"], "receipt": item["receipt"]}]}).encode()
        _check(*await producer.post("/v1/queues/bench-wake/release", rel))
    waiter.close()
    producer.close()
    return {
        "due_p50_ms": statistics.median(due_lag),
        "due_p99_ms": _pct(due_lag, 99),
        "enqueue_p50_ms": statistics.median(push_lag),
        "enqueue_p99_ms": _pct(push_lag, 99),
    }


# --------------------------------------------------------------------------- servers


def _wait_up(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    give_up = time.monotonic() + timeout
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("server did not come up")


def _start_dq(data_dir: str, port: int, fsync: str = "always") -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    cmd = [sys.executable, "-m", "dq.cli.main", "serve", "--data-dir", data_dir, "--port", str(port),
           "--fsync", fsync, "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=env)
    _wait_up(port, proc)
    return proc


def _start_bare(port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", BARE_APP, str(port)], cwd=REPO)
    _wait_up(port, proc)
    return proc


# --------------------------------------------------------------------------- main


async def measure(
    dq_port: int, nosync_port: int, bare_port: int, seconds: float, wake_samples: int, rounds: int
) -> dict[str, float]:
    """The floor and dq's single enqueue alternate, ``rounds`` times, and report medians:
    on a shared machine the load drifts between phases, and alternating keeps the
    ratio honest (``enqueue_c32_vs_floor`` is the median of per-round ratios)."""
    r: dict[str, float] = {}
    runs: dict[str, list[float]] = {k: [] for k in ("b1", "b32", "e1", "e32", "n32")}
    ratios, nosync_ratios = [], []
    for _ in range(rounds):
        runs["b1"].append(await bare(bare_port, 1, seconds))
        runs["e1"].append(await enqueue(dq_port, 1, 1, seconds))
        runs["b32"].append(await bare(bare_port, 32, seconds))
        runs["e32"].append(await enqueue(dq_port, 32, 1, seconds))
        runs["n32"].append(await enqueue(nosync_port, 32, 1, seconds))
        ratios.append(runs["e32"][-1] / runs["b32"][-1])
        nosync_ratios.append(runs["n32"][-1] / runs["b32"][-1])
    med = statistics.median
    r["bare_c1_req_s"], r["bare_c32_req_s"] = med(runs["b1"]), med(runs["b32"])
    r["enqueue_c1_req_s"], r["enqueue_c32_req_s"] = med(runs["e1"]), med(runs["e32"])
    r["enqueue_c32_nosync_req_s"] = med(runs["n32"])
    r["enqueue_c32_nosync_vs_floor"] = med(nosync_ratios)
    r["enqueue_batch100_items_s"] = await enqueue(dq_port, 8, 100, seconds)
    await fill(dq_port, "bench-single", int(6_000 * seconds))
    r["dequeue_release_single_items_s"] = await dequeue_release(
        dq_port, "bench-single", 16, 1, seconds
    )
    await fill(dq_port, "bench-batch", int(100_000 * seconds))
    r["dequeue_release_batch100_items_s"] = await dequeue_release(
        dq_port, "bench-batch", 4, 100, seconds
    )
    r.update(await wakeup(dq_port, wake_samples))
    r["enqueue_c32_vs_floor"] = med(ratios)
    r.update(await fsync_figures(dq_port))
    return r


async def fsync_figures(port: int) -> dict[str, float]:
    """Mean fsync latency and count over the whole run, from the server's /metrics."""
    c = await Conn.open(port)
    status, text = await c.request("GET", "/metrics", b"")
    c.close()
    _check(status, text)
    found = {}
    for line in text.decode().splitlines():
        for name in ("dq_fsync_duration_seconds_sum", "dq_fsync_duration_seconds_count"):
            if line.startswith(name + " "):
                found[name] = float(line.split()[1])
    count = found.get("dq_fsync_duration_seconds_count", 0.0)
    mean = found.get("dq_fsync_duration_seconds_sum", 0.0) / count if count else 0.0
    return {"fsyncs": count, "fsync_mean_ms": mean * 1000}


async def _asgi_post(app: Any, path: str, body: bytes) -> bytes:
    """One request straight into an ASGI app: no sockets, no client, no other process."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"host", b"dq"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())],
        "state": {},
    }  # fmt: skip
    sent = False
    out: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            out.append(message.get("body", b""))

    await app(scope, receive, send)
    return b"".join(out)


async def cpu_costs(reps: int = 200, rounds: int = 5) -> dict[str, float]:
    """CPU per request in this process (fsync=never), best of ``rounds``: robust to load.

    The dq app against the bare app (one enqueued item), and the dq app against the
    engine called directly (batches of 100)."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    from dq.server.app import create_app
    from dq.server.settings import Settings
    from dq.storage import NewItem, Release

    class Item(BaseModel):
        value: str
        encoding: str = "utf-8"
        deadline: int | None = None
        delay_ms: int | None = None

    class Body(BaseModel):
        items: list[Item]

    bare_app = FastAPI()

    @bare_app.post("/noop")
    async def noop(body: Body) -> dict[str, bool]:
        return {"ok": True}

    data = tempfile.mkdtemp(prefix="dq-bench-cpu-")
    app = create_app(Settings(data_dir=data, fsync="never"))
    one, hundred = _items_body(1, delay_ms=3_600_000), _items_body(100, delay_ms=3_600_000)
    new = [NewItem(VALUE.encode(), delay_ms=3_600_000)] * 100
    deq = json.dumps({"count": 100, "lease_ms": 60_000}).encode()
    best: dict[str, float] = {}

    def keep(name: str, t0: float) -> None:
        us = (time.perf_counter() - t0) / reps * 1e6
        best[name] = min(best.get(name, us), us)

    try:
        async with app.router.lifespan_context(app):
            engine = app.state.service.engine
            for _ in range(50):
                engine.enqueue("due", [NewItem(VALUE.encode())] * 1000)
            for _ in range(rounds):
                t0 = time.perf_counter()
                for _ in range(reps):
                    await _asgi_post(bare_app, "/noop", one)
                keep("cpu_bare_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps):
                    await _asgi_post(app, "/v1/queues/cpu/items", one)
                keep("cpu_enqueue1_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps):
                    engine.enqueue("cpu", new[:1])
                keep("cpu_engine_enqueue1_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps // 4):
                    await _asgi_post(app, "/v1/queues/cpu/items", hundred)
                keep("cpu_enqueue100_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps // 4):
                    engine.enqueue("cpu", new)
                keep("cpu_engine_enqueue100_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps // 8):
                    got = json.loads(await _asgi_post(app, "/v1/queues/due/dequeue", deq))["items"]
                    rel = {"items": [{"id": i["id"], "receipt": i["receipt"]} for i in got]}
                    await _asgi_post(app, "/v1/queues/due/release", json.dumps(rel).encode())
                keep("cpu_dequeue_release100_us", t0)
                t0 = time.perf_counter()
                for _ in range(reps // 8):
                    ds = engine.dequeue("due", 100, 60_000)
                    engine.release("due", [Release(d.id, d.receipt) for d in ds])
                keep("cpu_engine_dequeue_release100_us", t0)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    for k in ("cpu_enqueue100_us", "cpu_engine_enqueue100_us"):
        best[k] *= 4
    for k in ("cpu_dequeue_release100_us", "cpu_engine_dequeue_release100_us"):
        best[k] *= 8
    return best


def engine_floor(seconds: float) -> dict[str, float]:
    """The engine alone, in this process, fsync=always: what HTTP cannot beat."""
    import threading

    from dq.storage import Engine, EngineConfig, NewItem, Release

    data = tempfile.mkdtemp(prefix="dq-bench-engine-")
    out: dict[str, float] = {}
    try:
        with Engine.open(data, EngineConfig(fsync="always")) as engine:
            batch = [NewItem(VALUE.encode(), delay_ms=3_600_000)] * 100
            stop = time.perf_counter() + seconds
            done = [0]

            def producer() -> None:
                while time.perf_counter() < stop:
                    engine.enqueue("e", batch)
                    done[0] += 100

            t0 = time.perf_counter()
            threads = [threading.Thread(target=producer) for _ in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            out["engine_enqueue_batch100_items_s"] = done[0] / (time.perf_counter() - t0)
            due = [NewItem(VALUE.encode())] * 1000
            for _ in range(int(150 * seconds)):
                engine.enqueue("d", due)
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                got = engine.dequeue("d", 100, 60_000)
                if not got:  # drained early: the rate is over the time it took
                    break
                engine.release("d", [Release(d.id, d.receipt) for d in got])
                n += len(got)
            out["engine_dequeue_release_batch100_items_s"] = n / (time.perf_counter() - t0)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return out


def _report(r: dict[str, float], seconds: float, rounds: int) -> str:
    rows = [
        ("bare FastAPI POST, c=1", f"{r['bare_c1_req_s']:,.0f} req/s", "(floor)"),
        ("bare FastAPI POST, c=32", f"{r['bare_c32_req_s']:,.0f} req/s", "(floor)"),
        ("enqueue 1 item, c=1", f"{r['enqueue_c1_req_s']:,.0f} req/s", ""),
        ("enqueue 1 item, c=32", f"{r['enqueue_c32_req_s']:,.0f} req/s",
         f"{r['enqueue_c32_vs_floor']:.2f}x floor (target >= 0.70x)"),
        ("  same, server with --fsync never", f"{r['enqueue_c32_nosync_req_s']:,.0f} req/s",
         f"{r['enqueue_c32_nosync_vs_floor']:.2f}x floor (HTTP + engine CPU only)"),
        ("enqueue batch of 100, c=8", f"{r['enqueue_batch100_items_s']:,.0f} items/s", "target >= 100,000"),
        ("  engine alone, 8 threads", f"{r['engine_enqueue_batch100_items_s']:,.0f} items/s", "(ceiling)"),
        ("dequeue 1 + release 1, c=16", f"{r['dequeue_release_single_items_s']:,.0f} items/s", ""),
        ("dequeue 100 + release 100, c=4", f"{r['dequeue_release_batch100_items_s']:,.0f} items/s",
         "target >= 50,000"),
        ("  engine alone, 1 thread", f"{r['engine_dequeue_release_batch100_items_s']:,.0f} items/s",
         "(ceiling)"),
        ("long-poll wake-up after deadline", f"p50 {r['due_p50_ms']:.1f} ms, p99 {r['due_p99_ms']:.1f} ms",
         "target p99 <= 10 ms"),
        ("fsync (whole run, from /metrics)", f"mean {r['fsync_mean_ms']:.2f} ms over {r['fsyncs']:,.0f}", ""),
        ("long-poll delivery after enqueue sent (incl. fsync)", f"p50 {r['enqueue_p50_ms']:.1f} ms, p99 {r['enqueue_p99_ms']:.1f} ms", ""),
    ]  # fmt: skip
    rows += [
        ("CPU, in process, fsync=never (best of 5):", "", ""),
        ("  bare POST / dq enqueue 1 item / engine alone",
         f"{r['cpu_bare_us']:.0f} / {r['cpu_enqueue1_us']:.0f} / {r['cpu_engine_enqueue1_us']:.0f} us",
         f"{r['cpu_bare_us'] / r['cpu_enqueue1_us']:.2f}x floor"),
        ("  dq enqueue 100 / engine alone", f"{r['cpu_enqueue100_us']:.0f} / {r['cpu_engine_enqueue100_us']:.0f} us",
         f"{100e6 / r['cpu_enqueue100_us']:,.0f} items/s per core"),
        ("  dq dequeue+release 100 / engine alone",
         f"{r['cpu_dequeue_release100_us']:.0f} / {r['cpu_engine_dequeue_release100_us']:.0f} us",
         f"{100e6 / r['cpu_dequeue_release100_us']:,.0f} items/s per core"),
    ]  # fmt: skip
    out = ["| measurement | result | note |", "| --- | --- | --- |"]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    load = os.getloadavg()
    out.append("")
    out.append(
        f"fsync=always, 256-byte values, {seconds:g} s per phase (floor and single enqueue: "
        f"median of {rounds} alternating rounds); {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, load average at the end {load[0]:.1f}"
    )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="per throughput phase")
    parser.add_argument("--wake-samples", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3, help="alternating floor/enqueue rounds")
    parser.add_argument("--data-dir", help="where dq keeps its data (default: a temp dir)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    data_dir = args.data_dir or tempfile.mkdtemp(prefix="dq-bench-http-")
    nosync_dir = tempfile.mkdtemp(prefix="dq-bench-http-nosync-")
    dq_port, nosync_port, bare_port = free_port(), free_port(), free_port()
    procs = [
        _start_dq(data_dir, dq_port),
        _start_dq(nosync_dir, nosync_port, "never"),
        _start_bare(bare_port),
    ]
    try:
        results = uvloop.run(
            measure(dq_port, nosync_port, bare_port, args.seconds, args.wake_samples, args.rounds)
        )
    finally:
        for proc in procs:
            stop(proc)
        shutil.rmtree(nosync_dir, ignore_errors=True)
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    results.update(engine_floor(args.seconds))
    results.update(uvloop.run(cpu_costs()))
    print(
        json.dumps(results, indent=2) if args.json else _report(results, args.seconds, args.rounds)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
