"""Operator commands: ``dq create``, ``config``, ``delete``, ``pause``, ``resume``,
``peek`` (by id or key), ``browse``, ``redrive``, ``purge`` and ``backup``.

All but ``backup --data-dir`` talk to a running server (``--url``/``--token``, as the
other client commands). Each prints one line saying what happened (or a table for
``browse``/``peek``; ``--json`` for scripts); errors are one line on stderr and exit
status 1. ``delete`` and ``purge`` destroy items and ask for ``--yes``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import TYPE_CHECKING, Any

from dq.cli._format import plural, when
from dq.cli._local import data_dir_problem
from dq.cli._remote import add_common, console, emit_json, run_remote, value_text
from dq.cli._rules import add_setting_flags, describe, settings_from

if TYPE_CHECKING:
    from dq.client import BackupResult, BrowsedItem, Client, QueueInfo
    from dq.storage.backup import BackupResult as EngineBackup

__all__ = ["register"]


def _queue_cmd(subparsers: Any, name: str, help_: str, func: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = subparsers.add_parser(name, help=help_, description=help_)
    p.add_argument("queue")
    add_common(p)
    p.set_defaults(func=func)
    return p


def register(subparsers: Any) -> None:
    p = _queue_cmd(subparsers, "create", "create a queue (or replace its config)", create)
    add_setting_flags(p, create=True)
    p = _queue_cmd(
        subparsers, "config", "change some of a queue's settings (the others are kept)", config
    )
    add_setting_flags(p, create=False)
    p = _queue_cmd(subparsers, "delete", "delete a queue and all its items", delete)
    p.add_argument("--yes", action="store_true", help="really delete")
    p.add_argument(
        "--force",
        action="store_true",
        help="delete it even while other queues send their dead letters to it",
    )
    _queue_cmd(subparsers, "pause", "stop handing out items (writes go on)", pause)
    _queue_cmd(subparsers, "resume", "hand out items again", resume)
    p = _queue_cmd(subparsers, "peek", "show one item by id or key without leasing it", peek)
    p.add_argument("id", type=int, nargs="?", help="the item's id (or give --key)")
    p.add_argument("--key", help="the item the key names (docs/retries.md, Items by key)")
    p = _queue_cmd(subparsers, "browse", "list items in deadline order without leasing", browse)
    p.add_argument("--state", choices=("all", "due", "delayed", "leased"), default="all")
    p.add_argument("--limit", type=int, default=50, help="items per page (max 1000)")
    p.add_argument("--after", help="the cursor printed at the end of the previous page")
    p.add_argument("--values", action="store_true", help="show values")
    p = _queue_cmd(
        subparsers, "redrive", "move dead letters back to the queue they died in", redrive
    )
    p.add_argument("--to", help="send them here instead")
    p.add_argument("--id", type=int, action="append", dest="ids", help="only this item (repeat)")
    p.add_argument("--limit", type=int, help="move at most this many")
    p = _queue_cmd(subparsers, "purge", "remove every item of a queue", purge)
    p.add_argument("--yes", action="store_true", help="really remove every item")
    p = subparsers.add_parser(
        "backup",
        help="write a consistent copy of the data directory",
        description="Copy a data directory consistently. With --url, the running server "
        "writes the copy (it must run with --backup-dir, and DEST must be inside it); with "
        "--data-dir, the directory is copied directly (no server may have it open). "
        "Restore: start a server on the copy.",
    )
    p.add_argument("dest", help="a new directory")
    p.add_argument("--data-dir", help="copy this directory directly (the server stopped)")
    add_common(p)
    p.set_defaults(func=backup)


def create(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        from dq.client import QueueConfig

        _said(args, dq.put_queue(args.queue, settings_from(args, QueueConfig())))
        return 0

    return run_remote(args, action)


def config(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        current = dq.queue(args.queue).config
        if args.dead_letter_queue is None and current.max_deliveries is not None:
            # the server answers <queue>.dlq for a default one: keep it the default
            default = f"{args.queue}.dlq"
            if current.dead_letter_queue == default:
                current = dataclasses.replace(current, dead_letter_queue=None)
        _said(args, dq.put_queue(args.queue, settings_from(args, current)))
        return 0

    return run_remote(args, action)


def _said(args: argparse.Namespace, info: QueueInfo) -> None:
    """What ``create`` and ``config`` print: the queue's settings now."""
    if args.json:
        emit_json(info)
        return
    c = info.config
    print(
        f"queue {info.name}: lease {c.default_lease_ms} ms, "
        f"max deliveries {c.max_deliveries or '-'}, "
        f"dead letters to {c.dead_letter_queue or '-'}, "
        f"keys remembered {c.dedup_window_ms} ms, "
        f"delivery rules {describe(c)}"
    )


def _refuse(args: argparse.Namespace, what: str) -> int:
    print(f"dq {args.command}: this {what}; add --yes to go ahead", file=sys.stderr)
    return 2


def delete(args: argparse.Namespace) -> int:
    if not args.yes:
        return _refuse(args, f"deletes queue {args.queue} and all its items")

    def action(dq: Client) -> int:
        from dq.client import Conflict

        try:
            dq.delete_queue(args.queue, force=args.force)
        except Conflict as exc:
            if exc.code != "dead_letter_queue_in_use":
                raise
            print(f"dq delete: {exc.message} (--force)", file=sys.stderr)
            return 1
        if args.json:
            emit_json({"deleted": args.queue})
        else:
            print(f"deleted queue {args.queue}")
        return 0

    return run_remote(args, action)


def pause(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        info = dq.pause(args.queue)
        if args.json:
            emit_json(info)
        else:
            pending = plural(info.stats.pending, "item")
            print(f"paused {info.name} ({pending} pending; writes go on)")
        return 0

    return run_remote(args, action)


def resume(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        info = dq.resume(args.queue)
        if args.json:
            emit_json(info)
        else:
            print(f"resumed {info.name} ({plural(info.stats.due, 'item')} due)")
        return 0

    return run_remote(args, action)


def _table(items: list[BrowsedItem], values: bool) -> None:
    from rich.table import Table

    columns = ["id", "state", "deadline", "deliveries", "size", "lease_expires", "from"]
    table = Table(*columns, *(["value"] if values else []))
    for i in items:
        row = [
            str(i.id),
            i.state,
            when(i.deadline),
            "-" if i.stats is None else str(i.stats.dequeue_count),
            str(i.value_size),
            when(i.lease_expires),
            i.dead_lettered_from or "-",
        ]
        if values:
            row.append("-" if i.value is None else value_text(i.value)[:80])
        table.add_row(*row)
    console().print(table)


def peek(args: argparse.Namespace) -> int:
    if (args.id is None) == (args.key is None):
        print("dq peek: give the item's ID or --key KEY (one of them)", file=sys.stderr)
        return 2

    def action(dq: Client) -> int:
        if args.key is not None:
            item = dq.peek_key(args.queue, args.key)
        else:
            item = dq.peek(args.queue, args.id)
        if args.json:
            emit_json(item)
        else:
            _table([item], values=True)
            for why in item.errors:  # newest first: why its deliveries failed
                print(f"failed on delivery {why.delivery} at {when(why.at)}: {why.error}")
            if item.moved_to is not None:  # dead-lettered or redriven: a new id elsewhere
                to = item.moved_to
                print(f"moved to {to.queue} as item {to.id}: dq peek {to.queue} {to.id}")
        return 0

    return run_remote(args, action)


def browse(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        page = dq.browse(args.queue, args.state, args.after, args.limit, args.values)
        if args.json:
            emit_json(page)
            return 0
        _table(page.items, args.values)
        if page.next is not None:  # the same page as this one: state, size and values
            same = "" if args.state == "all" else f" --state {args.state}"
            same += f" --limit {args.limit}" + (" --values" if args.values else "")
            print(f"more: dq browse {args.queue}{same} --after {page.next}")
        return 0

    return run_remote(args, action)


def redrive(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        result = dq.redrive(args.queue, to=args.to, ids=args.ids, limit=args.limit)
        if args.json:  # the same exit status as the table: 1 if an item did not move
            emit_json(result)
            return 1 if result.failed else 0
        where = ", ".join(result.to) or "-"
        print(f"moved {plural(result.moved, 'item')} from {args.queue} to {where}")
        for f in result.failed:
            print(f"  not moved: item {f.id}: {f.error}: {f.message}", file=sys.stderr)
        return 1 if result.failed else 0

    return run_remote(args, action)


def purge(args: argparse.Namespace) -> int:
    if not args.yes:
        return _refuse(args, f"removes every item of queue {args.queue}")

    def action(dq: Client) -> int:
        n = dq.purge(args.queue)
        if args.json:
            emit_json({"purged": n})
        else:
            print(f"purged {plural(n, 'item')} from {args.queue}")
        return 0

    return run_remote(args, action)


def backup(args: argparse.Namespace) -> int:
    if args.data_dir is None:

        def action(dq: Client) -> int:
            result = dq.backup(args.dest)
            if args.json:
                emit_json(result)
            else:
                print(_backup_line(result))
            return 0

        return run_remote(args, action)
    problem = data_dir_problem(args.data_dir, must_exist=True)
    if problem is not None:
        print(f"dq backup: {problem}", file=sys.stderr)
        return 1
    from dq.storage import Engine, EngineConfig
    from dq.storage.errors import StorageError

    try:
        with Engine.open(args.data_dir, EngineConfig(auto_merge=False)) as engine:
            result = engine.backup(args.dest)
    except (StorageError, OSError) as exc:
        print(f"dq backup: {exc}", file=sys.stderr)
        return 1
    print(_backup_line(result))
    return 0


def _backup_line(result: BackupResult | EngineBackup) -> str:
    files, size = plural(result.files, "file"), plural(result.bytes, "byte")
    return f"backup written to {result.path}: {files}, {size}"
