"""Scale benchmark: 10,000,000 items of 256 bytes through one queue, with merging.

    python -m bench.scale [--items N] [--groups G [--group-limit L]] [--plot docs/scale.png]

Enqueue N items (half due now, half spread over the next hour), consume and release
the due half, move the engine's clock an hour on, consume and release the rest, and
let merging settle. With ``--groups G`` the items are spread round robin over G groups
and the queue has ``group_limit`` L (1 unless told): the delivery index then holds the
groups with a lease or a held-back item and up to ``MAX_HELD`` held keys, and the peak
RSS includes them (``docs/delivery.md``: memory). Prints peak RSS (server and compaction worker), disk bytes and
segment count over time, dequeue+release items/s at a 100,000-item and at the full
backlog, open time with the full backlog, write amplification (bytes the processes
wrote to disk / bytes enqueued) and disk use at the end; draws RSS, disk and segment
count over the run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import psutil

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release

VALUE_SIZE = 256
POOL = os.urandom(1 << 20)


class ShiftableClock:
    """Wall-clock milliseconds plus an offset the benchmark can move (to skip an hour)."""

    def __init__(self) -> None:
        self.offset = 0

    def __call__(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset


class Sampler(threading.Thread):
    """Samples RSS of the server and its worker, disk bytes and segment count."""

    def __init__(self, root: Path, engine_ref: list[Engine | None]) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.engine_ref = engine_ref
        self.rows: list[tuple[float, float, float, float, int]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()
        self.me = psutil.Process()

    def disk(self) -> int:
        total = 0
        for dirpath, _dirs, files in os.walk(self.root):
            for f in files:
                try:
                    total += os.path.getsize(os.path.join(dirpath, f))
                except OSError:
                    pass
        return total

    def run(self) -> None:
        while not self.stop.wait(1.0):
            kids = self.me.children()
            worker = max((k.memory_info().rss for k in kids), default=0)
            e = self.engine_ref[0]
            segs = (
                len(e.queue("scale").segments)
                if e is not None and "scale" in e.list_queues()
                else 0
            )
            self.rows.append(
                (
                    time.monotonic() - self.t0,
                    self.me.memory_info().rss / 1e6,
                    worker / 1e6,
                    self.disk() / 1e6,
                    segs,
                )
            )


def io_written() -> int:
    me = psutil.Process()
    total = me.io_counters().write_bytes
    for k in me.children():
        try:
            total += k.io_counters().write_bytes
        except psutil.Error:
            pass
    return total


def items(n: int, rng: random.Random, now: int, groups: int, first: int) -> list[NewItem]:
    """``n`` items, half due now; the ``first``-th item onwards of the run, round robin
    over ``groups`` groups if any. Each name is made as its item is (a client's text, as
    a server receives it): a list of them all held here would count a million names and
    the interpreter's table of interned strings they keep full in the measured RSS."""
    out = []
    for i in range(first, first + n):
        off = rng.randrange(0, len(POOL) - VALUE_SIZE)
        value = POOL[off : off + VALUE_SIZE]
        group = f"g{i % groups}" if groups else None
        if rng.random() < 0.5:
            out.append(NewItem(value, group=group))
        else:
            out.append(NewItem(value, deadline=now + rng.randrange(1, 3_600_000), group=group))
    return out


def consume(engine: Engine, limit: int | None = None) -> tuple[int, float]:
    done = 0
    t0 = time.perf_counter()
    while limit is None or done < limit:
        got = engine.dequeue("scale", 100, 600_000)
        if not got:
            break
        engine.release("scale", [Release(d.id, d.receipt) for d in got])
        done += len(got)
    return done, time.perf_counter() - t0


def fill(
    engine: Engine,
    clock: ShiftableClock,
    n: int,
    rng: random.Random,
    groups: int,
    group_limit: int,
) -> None:
    if groups:
        engine.put_queue("scale", QueueConfig(group_limit=group_limit))
    for start in range(0, n, 1000):
        batch = items(min(1000, n - start), rng, clock(), groups, start)
        engine.enqueue("scale", batch, timeout=600)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--items", type=int, default=10_000_000)
    ap.add_argument("--measure", type=int, default=50_000, help="items timed for dequeue+release")
    ap.add_argument("--plot", default="docs/scale.png")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--groups", type=int, default=0, help="spread the items over this many groups")
    ap.add_argument(
        "--group-limit", type=int, default=1, help="the queue's group_limit with --groups"
    )
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dq-scale-"))
    rng = random.Random(7)
    clock = ShiftableClock()
    cfg = EngineConfig(fsync="always")
    print(
        f"# bench/scale.py {time.strftime('%Y-%m-%d %H:%M')}: {args.items:,} items, data in {root}"
    )
    if args.groups:
        print(f"# over {args.groups:,} groups, group_limit {args.group_limit}")

    # dequeue+release at a 100,000-item backlog (same mix), a separate directory
    small_rates = []
    for attempt in range(3):  # median of three: one short window is at the mercy of the machine
        small = root / f"small-{attempt}"
        with Engine.open(small, cfg, clock=clock) as e:
            fill(e, clock, 100_000, rng, args.groups, args.group_limit)
            n, dt = consume(e, args.measure)
            small_rates.append(n / dt)
        shutil.rmtree(small)
    rate_small = sorted(small_rates)[1]
    print(
        f"dequeue+release at 100,000 backlog: {rate_small:,.0f} items/s (median of {small_rates})"
    )

    data = root / "big"
    ref: list[Engine | None] = [None]
    sampler = Sampler(data, ref)
    sampler.start()
    written0 = io_written()
    engine = Engine.open(data, cfg, clock=clock)
    ref[0] = engine
    t0 = time.perf_counter()
    fill(engine, clock, args.items, rng, args.groups, args.group_limit)
    print(f"enqueued {args.items:,} in {time.perf_counter() - t0:.0f} s")
    engine.compactor.wait_idle(600)
    written_engine = io_written() - written0  # before the close, while the worker lives
    ref[0] = None
    engine.close()
    opens = []
    for _ in range(3):
        t = time.perf_counter()
        engine = Engine.open(data, cfg, clock=clock)
        opens.append(time.perf_counter() - t)
        if len(opens) < 3:
            engine.close()
    ref[0] = engine
    print(
        f"open with the full backlog: {min(opens) * 1000:.0f} ms best, {max(opens) * 1000:.0f} ms worst"
    )
    written0 = io_written() - written_engine
    big_rates, n, dt = [], 0, 0.0
    for _ in range(3):
        k, t = consume(engine, args.measure)
        big_rates.append(k / t)
        n, dt = n + k, dt + t
    rate_big = sorted(big_rates)[1]
    print(
        f"dequeue+release at {args.items:,} backlog: {rate_big:,.0f} items/s (median of {big_rates})"
    )
    n2, dt2 = consume(engine)
    print(f"consumed the due half: {n + n2:,} items in {dt + dt2:.0f} s")
    clock.offset += 3_700_000
    n3, dt3 = consume(engine)
    print(f"an hour later, consumed the rest: {n3:,} items in {dt3:.0f} s")
    total = n + n2 + n3
    assert total == args.items, (total, args.items)
    settle_t0 = time.monotonic()
    while time.monotonic() - settle_t0 < 1800:
        s = engine.stats("scale")
        if (
            s.segments == 0
            and s.bytes_on_disk < 1 << 20
            and not engine.queue("scale").files.merging
        ):
            break
        time.sleep(1)
    print(f"merging settled in {time.monotonic() - settle_t0:.0f} s")
    written = io_written() - written0
    ref[0] = None
    engine.close()
    sampler.stop.set()
    sampler.join()
    disk_end = sampler.disk()
    rows = sampler.rows
    wa = written / (args.items * VALUE_SIZE)
    print()
    print("| measure | result | target |")
    print("| --- | --- | --- |")
    print(f"| peak RSS, server process | {max(r[1] for r in rows):.0f} MB | ≤ 256 MB |")
    print(f"| peak RSS, compaction worker | {max(r[2] for r in rows):.0f} MB | |")
    print(f"| peak disk | {max(r[3] for r in rows):,.0f} MB | |")
    print(f"| peak segment count | {max(r[4] for r in rows)} | |")
    print(f"| dequeue+release at 100,000 backlog | {rate_small:,.0f} items/s | |")
    print(
        f"| dequeue+release at {args.items:,} backlog | {rate_big:,.0f} items/s ({rate_big / rate_small:.2f}x) | ≥ 0.8x |"
    )
    print(f"| open with the full backlog | {min(opens) * 1000:.0f} ms | ≤ 1 s |")
    print(f"| write amplification (bytes written / bytes enqueued) | {wa:.2f} | ≤ 4 |")
    print(f"| disk at the end | {disk_end / 1e6:.3f} MB | ≤ 1 MB |")
    print("\n# samples: seconds, rss MB, worker rss MB, disk MB, segments")
    for r in rows[:: max(1, len(rows) // 40)]:
        print("# " + ", ".join(f"{x:.1f}" if isinstance(x, float) else str(x) for x in r))
    plot(rows, args.plot)
    shutil.rmtree(root, ignore_errors=True)


def plot(rows: list[tuple[float, float, float, float, int]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r[0] for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    axes[0].plot(t, [r[1] for r in rows], label="server")
    axes[0].plot(t, [r[2] for r in rows], label="compaction worker")
    axes[0].axhline(256, color="red", linestyle=":", label="target 256 MB")
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend()
    axes[1].plot(t, [r[3] for r in rows])
    axes[1].set_ylabel("disk (MB)")
    axes[2].plot(t, [r[4] for r in rows])
    axes[2].set_ylabel("segment files")
    axes[2].set_xlabel("seconds")
    fig.suptitle("bench/scale.py: 10M x 256 B items, enqueue → consume → settle")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot written to {path}")


if __name__ == "__main__":
    main()
