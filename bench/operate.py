"""What operating a queue costs: browsing a page of a large queue, peeking by id, and
the memory of remembered idempotency keys.

    .venv/bin/python -m bench.operate --items 1000000

Builds one queue with the engine directly (fsync never, batches of 1,000, 100-byte
values, deadlines spread over an hour so pages mix due and delayed items), freezes it
into segment files, then times (median of ``--runs``): a page of 1,000 items from the
start, from a cursor in the middle, of the delayed items only, and with values; a peek
of an item in the middle (a byte search of the segment blocks that can hold its id).
Python heap growth during a browse (tracemalloc) shows the queue is not loaded.
Then the memory per remembered key: ``--keys`` keyed enqueues into a fresh queue,
measured with tracemalloc (the key map, its expiry order, and the key strings), minus
the same enqueues without keys. Prints a Markdown table for docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import tempfile
import time
import tracemalloc
from collections.abc import Callable

from dq.storage import Engine, EngineConfig, NewItem
from dq.storage.browse import encode_cursor
from dq.storage.codec import encode_key


def timed(fn: Callable[[], object], runs: int) -> tuple[float, object]:
    out: object = None
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples), out


def build(engine: Engine, n: int) -> int:
    """Fill queue ``big``; returns the time its deadlines are spread around."""
    now = engine.now()
    value = os.urandom(50).hex().encode()  # 100 bytes
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        batch = [
            NewItem(value, deadline=now - 600_000 + ((start + j) * 7919) % 3_600_000)
            for j in range(min(1000, n - start))
        ]
        engine.enqueue("big", batch, timeout=600)
    engine.freeze("big")
    print(f"built {n:,} items in {time.perf_counter() - t0:.0f} s", flush=True)
    return now


def key_memory(root: str, n: int) -> float:
    """Bytes of Python heap per remembered key (keyed minus unkeyed enqueues)."""
    config = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    results = []
    for keyed in (False, True):
        with Engine.open(os.path.join(root, f"keys-{keyed}"), config) as engine:
            engine.enqueue("k", [NewItem(b"x")])
            tracemalloc.start()
            base = tracemalloc.get_traced_memory()[0]
            for start in range(0, n, 1000):
                engine.enqueue(
                    "k",
                    [
                        NewItem(b"x", key=f"order-{start + j:012d}" if keyed else None)
                        for j in range(1000)
                    ],
                )
            engine.freeze("k")  # what stays: the in-memory segment's share goes to a file
            used = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            results.append(used)
    return (results[1] - results[0]) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--keys", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="dq-bench-operate-")
    try:
        config = EngineConfig(fsync="never", auto_merge=False)
        with Engine.open(os.path.join(root, "data"), config) as engine:
            now = build(engine, args.items)
            s = engine.stats("big")
            print(f"segments {s.segments}, {s.bytes_on_disk / 1e6:.0f} MB on disk")
            first = engine.browse("big", "all", None, 1000)
            mid_id = args.items // 2
            assert engine.peek("big", mid_id).deadline is not None
            t_peek, _ = timed(lambda: engine.peek("big", mid_id), max(1, args.runs // 2))
            rows = []
            t, _ = timed(lambda: engine.browse("big", "all", None, 1000), args.runs)
            rows.append(("browse 1,000 items from the start", t))
            t, _ = timed(lambda: engine.browse("big", "all", None, 1000, True), args.runs)
            rows.append(("… with values", t))
            # Half way in key order: the deadlines are spread evenly over the hour that
            # starts 10 minutes before ``now`` (a cursor is the queue and a key; walking
            # there page by page would time thousands of pages, not one).
            cursor = encode_cursor("big", encode_key(now - 600_000 + 1_800_000, 0))
            t, _ = timed(lambda: engine.browse("big", "all", cursor, 1000), args.runs)
            rows.append(("browse 1,000 items from a cursor half way", t))
            t, _ = timed(lambda: engine.browse("big", "delayed", None, 1000), args.runs)
            rows.append(("browse 1,000 delayed items", t))
            rows.append((f"peek item {mid_id:,} by id (segment blocks searched)", t_peek))
            tracemalloc.start()
            engine.browse("big", "all", cursor, 1000, True)
            _cur, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert len(first.items) == 1000
        per_key = key_memory(root, args.keys)
        load = os.getloadavg()
        print()
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
            f"{platform.python_version()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
            f"load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}"
        )
        print()
        print(f"| operation ({args.items:,}-item queue, 100-byte values) | median |")
        print("| --- | --- |")
        for name, t in rows:
            print(f"| {name} | {t * 1000:.1f} ms |")
        print(f"| Python heap peak during one page with values | {peak / 1e6:.1f} MB |")
        print(f"| memory per remembered key ({args.keys:,} keys of 18 chars) | {per_key:.0f} B |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
