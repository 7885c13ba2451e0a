"""Storage engine benchmark: the numbers the storage issue names, printed as a table.

    python -m bench.engine [--quick]

- enqueue items/s, batches of 100 x 256-byte values, fsync always (1 and 4 writer
  threads: group commit) and never;
- dequeue+release items/s (batches of 100, fsync always);
- bytes on disk per item for 1,000,000 items of 278 incompressible bytes, in the log
  and in segment files, beside the original storage design's own figure (~67 bytes per item);
- time to open a data directory holding 1,000,000 items in segment files.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from dq.storage import Engine, EngineConfig, NewItem, Release

VALUE = os.urandom(256)


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f}"


def run_threads(workers: list[threading.Thread]) -> float:
    """Start the threads together, wait for all; seconds taken."""
    t0 = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - t0


def bench_enqueue(root: Path, fsync: str, threads: int, total: int) -> float:
    path = root / f"enq-{fsync}-{threads}"
    engine = Engine.open(path, EngineConfig(fsync=fsync))  # type: ignore[arg-type]
    per_thread = total // threads // 100
    batch = [NewItem(VALUE) for _ in range(100)]

    def work() -> None:
        for _ in range(per_thread):
            engine.enqueue("bench", batch)

    elapsed = run_threads([threading.Thread(target=work) for _ in range(threads)])
    engine.close()
    shutil.rmtree(path)
    return per_thread * threads * 100 / elapsed


def bench_dequeue_release(root: Path, total: int, consumers: int) -> float:
    """Consumers each loop dequeue(100) -> release(batch); releases share fsyncs."""
    path = root / f"deq-{consumers}"
    engine = Engine.open(path, EngineConfig(fsync="never"))
    batch = [NewItem(VALUE) for _ in range(100)]
    for _ in range(total // 100):
        engine.enqueue("bench", batch)
    engine.close()
    engine = Engine.open(path, EngineConfig(fsync="always"))
    counts = [0] * consumers

    def consume(n: int) -> None:
        while True:
            items = engine.dequeue("bench", 100, 60_000)
            if not items:
                return
            engine.release("bench", [Release(d.id, d.receipt) for d in items])
            counts[n] += len(items)

    elapsed = run_threads([threading.Thread(target=consume, args=(n,)) for n in range(consumers)])
    engine.close()
    shutil.rmtree(path)
    assert sum(counts) == total, (sum(counts), total)
    return total / elapsed


def bench_size_and_open(root: Path, n: int) -> dict[str, float]:
    path = root / "size"
    cfg = EngineConfig(fsync="never", memseg_bytes=1 << 40, compaction="inline")
    engine = Engine.open(path, cfg)
    for _ in range(n // 1000):
        engine.enqueue("size", [NewItem(os.urandom(278)) for _ in range(1000)], timeout=600)
    q = engine.queue("size")
    wal_bytes = q.commit.wal.size
    engine.freeze("size")
    seg_bytes = sum(r.file_size for r in q.segments)
    engine.close()
    opens = []
    for _ in range(5):
        t0 = time.perf_counter()
        engine = Engine.open(path, EngineConfig(fsync="never"))
        opens.append(time.perf_counter() - t0)
        assert engine.stats("size").pending == n
        engine.close()
    shutil.rmtree(path)
    return {
        "wal_overhead": wal_bytes / n - 278,
        "segment_overhead": seg_bytes / n - 278,
        "wal_mb": wal_bytes / 1e6,
        "segment_mb": seg_bytes / 1e6,
        "open_median": statistics.median(opens),
        "open_max": max(opens),
    }


def bench_prealloc(root: Path, seconds: float) -> list[tuple[str, str]]:
    """Log preallocation on and off: single sequential durable enqueues per second, and
    bytes written to the device per byte of value for batched enqueues."""
    import psutil

    me = psutil.Process()

    def written() -> int:
        return int(me.io_counters().write_bytes) + sum(
            int(k.io_counters().write_bytes) for k in me.children()
        )

    rows = []
    steps = EngineConfig().wal_prealloc_bytes  # the default: allocated, not written
    for prealloc in (0, steps, 0, steps):  # alternated: the disk's rate drifts
        cfg = EngineConfig(fsync="always", wal_prealloc_bytes=prealloc, auto_merge=False)
        path = root / f"prealloc-{prealloc}-{len(rows)}"
        with Engine.open(path, cfg) as engine:
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                engine.enqueue("p", [NewItem(VALUE)])
                n += 1
            rate = n / (time.perf_counter() - t0)
            w0 = written()
            for _ in range(100):
                engine.enqueue("p", [NewItem(VALUE) for _ in range(1000)])
            engine.compactor.wait_idle(120)
            ratio = (written() - w0) / (100_000 * len(VALUE))
        shutil.rmtree(path)
        label = f"log preallocation {f'{prealloc >> 10} KiB steps' if prealloc else 'off'}"
        rows.append((f"{label}: single sequential enqueues, fsync always", f"{rate:,.0f}/s"))
        rows.append((f"{label}: bytes written per value byte, batches of 1000", f"{ratio:.2f}"))
        print(rows[-2], rows[-1])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="smaller runs (a smoke check)")
    ap.add_argument("--dir", default=None, help="where to put data (default: a temp dir)")
    ap.add_argument("--prealloc", action="store_true", help="only compare log preallocation")
    args = ap.parse_args()
    scale = 10 if args.quick else 1
    root = Path(args.dir or tempfile.mkdtemp(prefix="dq-bench-"))
    root.mkdir(parents=True, exist_ok=True)
    print(f"# bench/engine.py  {time.strftime('%Y-%m-%d %H:%M')}  {platform.node()}")
    print(f"# {os.cpu_count()} CPUs, Python {platform.python_version()}, load {os.getloadavg()}")
    if args.prealloc:
        print_table(bench_prealloc(root, 3.0))
        shutil.rmtree(root, ignore_errors=True)
        return
    rows = []
    for fsync, threads in (("always", 1), ("always", 4), ("never", 1)):
        r = bench_enqueue(root, fsync, threads, 400_000 // scale)
        rows.append(
            (f"enqueue, batch 100, fsync {fsync}, {threads} thread(s)", f"{r:,.0f} items/s")
        )
        print(rows[-1])
    for consumers in (1, 4):
        r = bench_dequeue_release(root, 200_000 // scale, consumers)
        rows.append(
            (
                f"dequeue+release, batch 100, fsync always, {consumers} consumer(s)",
                f"{r:,.0f} items/s",
            )
        )
        print(rows[-1])
    s = bench_size_and_open(root, 1_000_000 // scale)
    rows.append(
        ("log overhead per item (278-byte random values)", f"{s['wal_overhead']:.1f} bytes")
    )
    rows.append(
        ("segment overhead per item (278-byte random values)", f"{s['segment_overhead']:.1f} bytes")
    )
    rows.append(("log / segment size", f"{s['wal_mb']:.0f} MB / {s['segment_mb']:.0f} MB"))
    rows.append(
        (
            "open, items in segment files",
            f"{s['open_median'] * 1000:.0f} ms median, {s['open_max'] * 1000:.0f} ms max",
        )
    )
    print_table(rows)
    shutil.rmtree(root, ignore_errors=True)


def print_table(rows: list[tuple[str, str]]) -> None:
    print()
    print("| measure | result |")
    print("| --- | --- |")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
