"""``dq queues`` and ``dq stats QUEUE``: queue listing and live figures."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dq.cli._format import when
from dq.cli._remote import add_common, console, emit_json, run_remote

if TYPE_CHECKING:
    from dq.client import Client, QueueInfo

__all__ = ["register"]

_COLUMNS = ("pending", "due", "delayed", "leased", "segments", "bytes_on_disk", "oldest_due_age_ms")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("queues", help="list queues with their figures")
    add_common(p)
    p.set_defaults(func=queues)
    p = subparsers.add_parser("stats", help="one queue's config and live stats")
    p.add_argument("queue")
    add_common(p)
    p.set_defaults(func=stats)


def _cell(v: object) -> str:
    return "-" if v is None else str(v)


def queues(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        found = dq.queues()
        if args.json:
            emit_json(found)
            return 0
        from rich.table import Table

        table = Table("queue", *_COLUMNS)
        for q in found:
            table.add_row(q.name, *(_cell(getattr(q.stats, c)) for c in _COLUMNS))
        console().print(table)
        return 0

    return run_remote(args, action)


def _show(info: QueueInfo) -> None:
    from rich.table import Table

    table = Table("field", "value", title=f"queue {info.name}")
    for name in ("default_lease_ms", "max_deliveries", "dead_letter_queue", "dedup_window_ms"):
        table.add_row(name, _cell(getattr(info.config, name)))
    # paused first among the figures: a paused queue's due items are not handed out
    table.add_row("paused", _cell(info.stats.paused))
    table.add_row("paused_since", when(info.stats.paused_since))
    for name in (*_COLUMNS, "oldest_lease_age_ms", "next_id"):
        table.add_row(name, _cell(getattr(info.stats, name)))
    for name, value in sorted(info.stats.extra.items()):
        table.add_row(name, str(value))
    console().print(table)


def stats(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        info = dq.queue(args.queue)
        if args.json:
            emit_json(info)
        else:
            _show(info)
        return 0

    return run_remote(args, action)
