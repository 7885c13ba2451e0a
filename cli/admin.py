"""``dq queues`` and ``dq stats QUEUE``: queue listing and live figures.

What an operator reads first is shown by default: the counts by state, what died or
came back, the rates and how late the oldest due item is. Storage internals (segment
files, bytes on disk, the engine's counters) are behind ``--all``; ``--json`` prints
everything the API answers, as it answers it.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dq.cli._format import age, when
from dq.cli._remote import add_common, console, emit_json, run_remote
from dq.cli._rules import describe

if TYPE_CHECKING:
    from dq.client import Client, QueueInfo, QueueStats

__all__ = ["register"]

_ALL_HELP = "also show storage internals (segment files, bytes on disk, engine counters)"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("queues", help="list queues with their figures")
    p.add_argument("--all", action="store_true", help=_ALL_HELP)
    add_common(p)
    p.set_defaults(func=queues)
    p = subparsers.add_parser("stats", help="one queue's config and live stats")
    p.add_argument("queue")
    p.add_argument("--all", action="store_true", help=_ALL_HELP)
    add_common(p)
    p.set_defaults(func=stats)


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


def _rate(per_s: float) -> str:
    """Items per second as the dashboard shows them: 0, 0.02, 12.5, 340."""
    if per_s == 0:
        return "0"
    return f"{per_s:.0f}" if per_s >= 100 else f"{per_s:.{1 if per_s >= 10 else 2}f}"


def _size(n: int) -> str:
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    size, i = float(n), 0
    while size >= 1024 and i < len(units) - 1:
        size, i = size / 1024, i + 1
    return f"{n} B" if i == 0 else f"{size:.1f} {units[i]}"


def _name(name: str, stats: QueueStats) -> str:
    return f"{name} (paused)" if stats.paused else name


def queues(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        found = dq.queues()
        if args.json:
            emit_json(found)
            return 0
        from rich.table import Table

        table = Table("queue", "pending", "due", "delayed", "leased", "dead-lettered")
        table.add_column("oldest due")
        if args.all:
            table.add_column("segments")
            table.add_column("on disk")
        for q in found:
            s = q.stats
            row = [_name(q.name, s), str(s.pending), str(s.due), str(s.delayed), str(s.leased)]
            row += [str(s.dead_lettered), age(s.oldest_due_age_ms)]
            if args.all:
                row += [str(s.segments), _size(s.bytes_on_disk)]
            table.add_row(*row)
        console().print(table)
        return 0

    return run_remote(args, action)


def _show(info: QueueInfo, everything: bool) -> None:
    from rich.table import Table

    s, c = info.stats, info.config
    table = Table("field", "value", title=f"queue {info.name}")
    # paused first: a paused queue's due items are not handed out, whatever the counts
    table.add_row("paused", f"yes, since {when(s.paused_since)}" if s.paused else "no")
    for label, value in (
        ("pending", s.pending),
        ("due", s.due),
        ("delayed", s.delayed),
        ("leased", s.leased),
        ("dead-lettered", s.dead_lettered),
        ("lease expired", s.lease_expired),
    ):
        table.add_row(label, str(value))
    table.add_row("enqueued/s", _rate(s.enqueue_per_s))
    table.add_row("dequeued/s", _rate(s.dequeue_per_s))
    table.add_row("released/s", _rate(s.release_per_s))
    table.add_row("oldest due", age(s.oldest_due_age_ms))
    table.add_row("oldest lease", age(s.oldest_lease_age_ms))
    table.add_row("default lease", age(c.default_lease_ms))
    table.add_row("max deliveries", _cell(c.max_deliveries))
    table.add_row("dead letters to", _cell(c.dead_letter_queue))
    table.add_row("keys remembered", age(c.dedup_window_ms) if c.dedup_window_ms else "off")
    table.add_row("delivery rules", describe(c))
    if s.groups or s.held or s.rate_limited:
        table.add_row("groups leased or held", str(s.groups))
        table.add_row("held back", str(s.held))
        table.add_row("rate-limited", str(s.rate_limited))
    if everything:
        table.add_row("segments", str(s.segments))
        table.add_row("on disk", _size(s.bytes_on_disk))
        table.add_row("next id", str(s.next_id))
        for name, value in sorted(s.extra.items()):
            table.add_row(name, str(value))
    console().print(table)
    if not everything:
        print("dead-lettered, lease expired: since the server started; more: --all")


def stats(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        info = dq.queue(args.queue)
        if args.json:
            emit_json(info)
        else:
            _show(info, args.all)
        return 0

    return run_remote(args, action)
