"""``dq top`` and ``dq tail QUEUE``: live views over shared memory, no HTTP.

``dq top`` reads the telemetry ring (docs/shm.md, "Telemetry ring") and shows the newest
snapshot, refreshed live with ``rich``; ``--once`` prints one table and exits.
``dq tail QUEUE`` subscribes to the broadcast ring and prints one line per event until
interrupted (or ``--count`` events / ``--timeout`` seconds). Both need a server on the
same host serving its rings (the default; not ``--no-shm``), and its data directory. Invariant: neither writes to any
ring but its own reader entry and lock words, so they cannot slow or break the server.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from dq.cli._format import age, when

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
    p.add_argument("--all", action="store_true", help="also show fsync time and segment files")
    p.set_defaults(func=top)
    p = subparsers.add_parser("tail", help="print a queue's events as they happen")
    p.add_argument("queue", help="queue name, or '*' for every queue")
    _data_dir(p)
    p.add_argument("--count", type=int, default=0, help="stop after N events")
    p.add_argument("--timeout", type=float, default=0.0, help="stop after S seconds")
    p.set_defaults(func=tail)


def _rate(milli: int) -> str:
    return f"{milli / 1000:.1f}"


#: The queue column is never narrower than this; a longer name folds onto more lines.
_MIN_NAME = 12


def _table(figures: list[QueueFigures], width: int, everything: bool = False) -> Table:
    """One snapshot as a table for a console ``width`` columns wide (80 is enough):
    no vertical rules, one space between columns, the figures as wide as they need,
    the queue column as wide as its longest name or what is left (names fold onto the
    next lines, never cut short), lateness as a duration."""
    from rich import box
    from rich.table import Table

    when_ = time.strftime("%H:%M:%S", time.localtime(figures[0].time / 1000)) if figures else "-"
    title = f"dq top - snapshot {figures[0].seq if figures else '-'} at {when_}"
    columns = ["pending", "due", "delayed", "leased", "enq/s", "rel/s", "exp/s", "late"]
    if everything:
        columns += ["fsync", "segs"]
    rows = []
    for f in figures:
        row = [f.queue, str(f.pending), str(f.due), str(f.delayed), str(f.leased)]
        row += [_rate(f.enqueued_milli), _rate(f.released_milli), _rate(f.expired_milli)]
        row.append("-" if f.lateness_ms < 0 else age(f.lateness_ms))
        if everything:
            row += [age(f.fsync_us / 1000) if f.fsyncs else "-", str(f.segments)]
        rows.append(row)
    widths = [max([len(c), *(len(r[i + 1]) for r in rows)]) for i, c in enumerate(columns)]
    left = width - sum(widths) - len(widths)  # each figure has one space before it
    longest = max((len(f.queue) for f in figures), default=5)
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    table.add_column("queue", width=max(_MIN_NAME, min(longest, left)), overflow="fold")
    for column, w in zip(columns, widths, strict=True):
        table.add_column(column, justify="right", min_width=w, no_wrap=True)
    for row in rows:
        table.add_row(*row)
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
            console.print(_table(latest(ring), console.width, args.all))
            return 0
        n = 0
        with Live(
            _table(latest(ring), console.width, args.all), console=console, auto_refresh=False
        ) as live:
            while not args.iterations or n < args.iterations:
                time.sleep(args.interval)
                live.update(_table(latest(ring), console.width, args.all), refresh=True)
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
