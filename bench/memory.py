"""Memory per queue and per in-memory entry, measured with ``tracemalloc``.

    python -m bench.memory [--items 50000] [--queues 200]

Prints, for values of several sizes, the bytes Python allocates per item held in a
queue's in-memory segment (the value's own bytes included, and beyond them), the bytes
one empty queue costs, and the bytes a leased item costs the in-flight set
(``storage/_leases.c``: the lease's record, its slot in the id table, its places in the
expiry and dequeue-order heaps). Everything runs in one process with ``fsync="never"`` and
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
#: a lease that outlasts the measurement (one hour)
LONG_LEASE = 3_600_000


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


def measure_leases(root: str, items: int) -> float:
    """Bytes per live lease: ``tracemalloc`` over dequeuing ``items`` items under a long
    lease (what each dequeue hands back let go of), the cursor's move included."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False, memseg_bytes=1 << 40)
    with Engine.open(os.path.join(root, "leases"), cfg) as e:
        for _ in range(items // 1000):
            e.enqueue("q", [NewItem(b"x" * 16) for _ in range(1000)])
        e.dequeue("q", 1, LONG_LEASE)  # warm: the first lease makes the tables
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        leased = 1
        while leased < items:
            leased += len(e.dequeue("q", min(1000, items - leased), LONG_LEASE))
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert e.stats("q").leased == items
        return (after - before) / (items - 1)


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
    parser.add_argument("--leases", type=int, default=100_000)
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
        per_lease = measure_leases(root, args.leases)
        print(f"one leased item ({args.leases:,} leases): {per_lease:,.0f} bytes")


if __name__ == "__main__":
    main()
