"""``dq top`` and ``dq tail QUEUE``: live views over shared memory, no HTTP.

``dq top`` reads the telemetry ring (docs/shm.md, "Telemetry ring") and shows the newest
snapshot, refreshed live with ``rich``; ``--once`` prints one table and exits.
``dq tail QUEUE`` subscribes to the broadcast ring and prints one line per event until
interrupted (or ``--count`` events / ``--timeout`` seconds). Both need a server started
with ``DQ_SHM=1`` on the same host and data directory. Invariant: neither writes to any
ring but its own reader entry and lock words, so they cannot slow or break the server.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from dq.cli._format import when

if TYPE_CHECKING:
    from rich.table import Table

    from dq.shm.telemetry import QueueFigures

__all__ = ["register"]


def _data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--data-dir",
        default=os.environ.get("DQ_DATA_DIR", "./dq-data"),
        help="the server's data directory (default: $DQ_DATA_DIR or ./dq-data)",
    )


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("top", help="live per-queue figures from shared memory")
    _data_dir(p)
    p.add_argument("--once", action="store_true", help="print one snapshot and exit")
    p.add_argument("--iterations", type=int, default=0, help="stop after N refreshes")
    p.add_argument("--interval", type=float, default=1.0, help="refresh every S seconds")
    p.set_defaults(func=top)
    p = subparsers.add_parser("tail", help="print a queue's events as they happen")
    p.add_argument("queue", help="queue name, or '*' for every queue")
    _data_dir(p)
    p.add_argument("--count", type=int, default=0, help="stop after N events")
    p.add_argument("--timeout", type=float, default=0.0, help="stop after S seconds")
    p.set_defaults(func=tail)


def _rate(milli: int) -> str:
    return f"{milli / 1000:.1f}"


def _table(figures: list[QueueFigures]) -> Table:
    from rich.table import Table

    when = time.strftime("%H:%M:%S", time.localtime(figures[0].time / 1000)) if figures else "-"
    table = Table(title=f"dq top - snapshot {figures[0].seq if figures else '-'} at {when}")
    for column in ("queue", "pending", "due", "leased", "delayed", "enq/s", "rel/s", "exp/s"):
        table.add_column(column, justify="left" if column == "queue" else "right")
    table.add_column("late ms", justify="right")
    table.add_column("fsync us", justify="right")
    for f in figures:
        table.add_row(
            f.queue, str(f.pending), str(f.due), str(f.leased), str(f.delayed),
            _rate(f.enqueued_milli), _rate(f.released_milli), _rate(f.expired_milli),
            "-" if f.lateness_ms < 0 else str(f.lateness_ms), str(f.fsync_us),
        )  # fmt: skip
    if not figures:
        table.caption = "no queues yet"
    return table


def top(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from dq.shm.errors import ShmError
    from dq.shm.subscriber import telemetry
    from dq.shm.telemetry import latest

    console = Console()
    try:
        ring = telemetry(args.data_dir)
        if args.once:
            console.print(_table(latest(ring)))
            return 0
        n = 0
        with Live(_table(latest(ring)), console=console, auto_refresh=False) as live:
            while not args.iterations or n < args.iterations:
                time.sleep(args.interval)
                live.update(_table(latest(ring)), refresh=True)
                n += 1
    except ShmError as exc:
        print(f"dq top: {exc}", file=sys.stderr)
        return 2
    return 0


def tail(args: argparse.Namespace) -> int:
    from dq.shm.errors import ShmError
    from dq.shm.subscriber import subscribe

    queue = None if args.queue == "*" else args.queue
    give_up = time.monotonic() + args.timeout if args.timeout else None
    seen = 0
    try:
        with subscribe(args.data_dir, queue) as sub:
            print(f"# tailing {args.queue} in {args.data_dir}", flush=True)
            while not args.count or seen < args.count:
                left = 1.0 if give_up is None else give_up - time.monotonic()
                if left <= 0:
                    break
                for event in sub.poll(min(left, 1.0)):
                    ids = ",".join(map(str, event.ids[:20])) + (
                        "..." if len(event.ids) > 20 else ""
                    )
                    line = f"{when(event.time)} {event.kind:<13} {event.queue} {ids}"
                    print(line.rstrip(), flush=True)
                    seen += 1
                    if args.count and seen >= args.count:
                        break
    except ShmError as exc:
        print(f"dq tail: {exc}", file=sys.stderr)
        return 2
    return 0
