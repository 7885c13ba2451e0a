"""Dequeue with many groups, half of them held back by ``group_limit``, against the same
queue without groups; and the memory a group costs the delivery index.

    python -m bench.groups [--groups 100000] [--per-group 4] [--batch 10] [--quick]

The rate: a queue holds ``groups`` x ``per-group`` due items, enqueued round robin
over the groups, so every group's items are spread over the whole backlog. With
``group_limit`` 1, the first item of every other group is leased (a long lease, never
released) before the measurement: those groups are held back, and every later item of
theirs must wait. The timed loop dequeues ``batch`` items and releases them, until the
deliverable items are all delivered. The baseline is the same queue, the same items
without groups and the same number of long leases. ``docs/delivery.md`` promises the
grouped rate at least 0.8x the baseline: finding the next deliverable item does not walk
the held-back ones (each is passed by the cursor once, into its group's FIFO).

The memory: ``tracemalloc`` over leasing the first item of each of ``groups`` groups
(two items each, ``group_limit`` 1, so the second is held), minus the same leases
without groups; per group, beyond the 16 bytes of its held item's key.

Engine in process, ``fsync="never"``, inline compaction: the figures are the engine's
own work. Run it on a quiet machine; ``--quick`` is a smoke run (2,000 groups).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tempfile
import time
import tracemalloc

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release

CONFIG = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
LONG = 3_600_000


def _fill(e: Engine, queue: str, groups: int, per_group: int, grouped: bool) -> None:
    names = [f"g{n}" for n in range(groups)]
    batch: list[NewItem] = []
    for _round in range(per_group):
        for name in names:
            batch.append(NewItem(b"x" * 32, group=name if grouped else None))
            if len(batch) == 1000:
                e.enqueue(queue, batch)
                batch = []
    if batch:
        e.enqueue(queue, batch)


def rate(root: str, groups: int, per_group: int, batch: int, grouped: bool) -> tuple[float, int]:
    """(deliveries a second, deliveries) of the timed dequeue + release loop."""
    with Engine.open(os.path.join(root, f"rate-{grouped}"), CONFIG) as e:
        queue = "q"
        e.put_queue(queue, QueueConfig(group_limit=1 if grouped else None))
        held = groups // 2
        # the blockers: the first item of every held-back group, leased and kept
        names = [f"g{n}" for n in range(0, groups, 2)]
        for start in range(0, held, 1000):
            chunk = names[start : start + 1000]
            e.enqueue(queue, [NewItem(b"b", group=n if grouped else None) for n in chunk])
        leased = 0
        while leased < held:
            leased += len(e.dequeue(queue, min(1000, held - leased), LONG))
        _fill(e, queue, groups, per_group, grouped)
        # grouped: the deliverable items are the other half's; ungrouped: as many
        deliverable = (groups - held) * per_group
        gc.collect()
        done = 0
        start = time.perf_counter()
        while done < deliverable:
            got = e.dequeue(queue, min(batch, deliverable - done), 60_000)
            if not got:
                break
            e.release(queue, [Release(d.id, d.receipt) for d in got])
            done += len(got)
        elapsed = time.perf_counter() - start
        return done / elapsed, done


def memory_per_group(root: str, groups: int) -> float:
    """Bytes the index holds per group with one lease and one held item, beyond the
    held item's 16-byte key and beyond what the same leases cost without groups."""
    costs = []
    for grouped in (False, True):
        with Engine.open(os.path.join(root, f"mem-{grouped}"), CONFIG) as e:
            e.put_queue("m", QueueConfig(group_limit=1 if grouped else None))
            _fill(e, "m", groups, 2, grouped)
            gc.collect()
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            leased = 0
            while leased < groups:
                leased += len(e.dequeue("m", min(1000, groups - leased), LONG))
            if grouped:  # one more look: the cursor passes every second item, held
                assert e.dequeue("m", 1, LONG) == []
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            if grouped:  # every second item was passed and held
                index = e.queue("m").deliveries.index
                assert index.indexed == groups and index.group_count == groups, index.indexed
            costs.append((after - before) / groups)
    return costs[1] - costs[0] - 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--per-group", type=int, default=4)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2,000 groups")
    args = parser.parse_args()
    if args.quick:
        args.groups = 2_000
    print(f"# {platform.node()} {platform.python_implementation()} {platform.python_version()}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as root:
        base, n0 = rate(root, args.groups, args.per_group, args.batch, grouped=False)
        ruled, n1 = rate(root, args.groups, args.per_group, args.batch, grouped=True)
        print(f"groups {args.groups:,}, half held back, {args.per_group} items each")
        print("| queue | deliveries | dequeue + release a second |")
        print("| --- | ---: | ---: |")
        print(f"| no groups | {n0:,} | {base:,.0f} |")
        print(f"| group_limit 1 | {n1:,} | {ruled:,.0f} |")
        print(f"grouped / ungrouped: {ruled / base:.2f} (promised >= 0.8)")
        per = memory_per_group(root, args.groups)
        print(f"memory per group (one lease, one held item): {per:,.0f} bytes beyond its items")


if __name__ == "__main__":
    main()
