"""Memory per queue and per in-memory entry, measured with ``tracemalloc``.

    python -m bench.memory [--items 50000] [--queues 200]

Prints, for values of several sizes, the bytes Python allocates per item held in a
queue's in-memory segment (the value's own bytes included, and beyond them), and the
bytes one empty queue costs. Everything runs in one process with ``fsync="never"`` and
inline compaction, and the log limit is raised so nothing is frozen while measuring:
the figures are the in-memory segment's own cost, which is what ``memseg_bytes``
bounds (``docs/storage.md``, "Memory").
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tempfile
import time
import tracemalloc

from dq.storage import Engine, EngineConfig, NewItem

SIZES = (0, 16, 100, 1000)


def measure_entries(root: str, size: int, items: int) -> tuple[float, float]:
    """(bytes per entry in all, bytes per entry beyond the value) for ``items`` values."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False, memseg_bytes=1 << 40)
    with Engine.open(os.path.join(root, f"entries-{size}"), cfg) as e:
        e.enqueue("q", [NewItem(b"warm")])
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(items // 1000):  # what a request hands in, then lets go of
            e.enqueue("q", [NewItem(os.urandom(size)) for _ in range(1000)])
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        per = (after - before) / items
        return per, per - size


def measure_queues(root: str, queues: int) -> float:
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    with Engine.open(os.path.join(root, "queues"), cfg) as e:
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(queues):
            e.ensure_queue(f"q{i}")
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return (after - before) / queues


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--queues", type=int, default=200)
    args = parser.parse_args()
    print(f"# {platform.node()} {platform.python_implementation()} {platform.python_version()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as root:
        print("| value bytes | bytes per in-memory entry | beyond the value |")
        print("| ---: | ---: | ---: |")
        for size in SIZES:
            per, overhead = measure_entries(root, size, args.items)
            print(f"| {size} | {per:,.0f} | {overhead:,.0f} |")
        print()
        print(f"one empty queue: {measure_queues(root, args.queues):,.0f} bytes")


if __name__ == "__main__":
    main()
