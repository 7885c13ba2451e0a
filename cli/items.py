"""``dq put``, ``dq get``, ``dq ack``, ``dq requeue``, ``dq fail``: item commands against a
live server."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from dq.cli._deadline import add_deadline_flags, deadline_of
from dq.cli._format import plural, when
from dq.cli._remote import add_common, console, emit_json, run_remote, value_text

if TYPE_CHECKING:
    from dq.client import Client, QueueStats

__all__ = ["register"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "put",
        help="enqueue items",
        description="Enqueue one item per VALUE. Without VALUE (or with '-') all of stdin "
        "is one item, its bytes as they are; with --lines each line of stdin is one item.",
    )
    p.add_argument("queue")
    p.add_argument(
        "values",
        nargs="*",
        metavar="VALUE",
        help="the items' values; none or '-': all of stdin as one item (see --lines)",
    )
    p.add_argument(
        "--lines",
        action="store_true",
        help="one item per line of stdin (the line without its line ending; empty lines "
        "are skipped)",
    )
    add_deadline_flags(p)
    p.add_argument(
        "--key",
        action="append",
        help="idempotency key, one per VALUE in order (a repeat within the queue's "
        "dedup window answers the first item and writes nothing)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="with --key: a repeat gives the key's pending item this value and deadline "
        "(one item, never two: debounce); a leased one is left be and a new item takes "
        "the key",
    )
    p.add_argument(
        "--group",
        help="the items' group (1-128 printable ASCII characters), which the queue's "
        "delivery rules go by: group_limit, fair, rate_limit (docs/delivery.md)",
    )
    add_common(p)
    p.set_defaults(func=put)

    p = subparsers.add_parser("get", help="dequeue (lease) due items")
    p.add_argument("queue")
    p.add_argument("-n", "--count", type=int, default=1)
    p.add_argument("--lease-ms", type=int, help="lease length (default: the queue's)")
    p.add_argument("--wait-ms", type=int, default=0, help="long-poll this long")
    p.add_argument("--ack", action="store_true", help="release each item right away")
    add_common(p)
    p.set_defaults(func=get)

    p = subparsers.add_parser("ack", help="release (acknowledge) an item")
    p.add_argument("queue")
    p.add_argument("id", type=int)
    p.add_argument("receipt")
    add_common(p)
    p.set_defaults(func=ack)

    p = subparsers.add_parser("requeue", help="give an item back with a new deadline")
    p.add_argument("queue")
    p.add_argument("id", type=int)
    p.add_argument("receipt")
    add_deadline_flags(p)
    add_common(p)
    p.set_defaults(func=requeue)

    p = subparsers.add_parser(
        "fail",
        help="hand an item back because it failed (the queue's retry policy says when)",
        description="Hand a leased item back because it failed: it is due again when the "
        "queue's retry policy says (docs/retries.md) and keeps REASON as its last error.",
    )
    p.add_argument("queue")
    p.add_argument("id", type=int)
    p.add_argument("receipt")
    p.add_argument("reason", nargs="?", default="", help="why it failed (up to 4096 bytes)")
    add_common(p)
    p.set_defaults(func=fail)


def put(args: argparse.Namespace) -> int:
    from dq.client import NewItem

    from_stdin = not args.values or args.values == ["-"]
    if args.lines and not from_stdin:
        print("dq put: --lines reads stdin: give no VALUE (or '-')", file=sys.stderr)
        return 2
    raw: list[bytes]
    if not from_stdin:
        raw = [os.fsencode(v) for v in args.values]  # as given, even if not UTF-8
    elif args.lines:  # splitlines would also split at \x0c, \x1c...: a value may hold those
        raw = [line.rstrip(b"\r") for line in sys.stdin.buffer.read().split(b"\n")]
        raw = [line for line in raw if line]
        if not raw:
            print("dq put: no lines on stdin: nothing enqueued", file=sys.stderr)
            return 0
    else:
        raw = [sys.stdin.buffer.read()]
    keys = args.key or []
    if args.replace and not keys:
        print("dq put: --replace replaces the item of a key: give --key", file=sys.stderr)
        return 2
    if keys and len(keys) != len(raw):
        print(f"dq put: give one --key per value ({len(raw)}), not {len(keys)}", file=sys.stderr)
        return 2
    deadline, delay_ms = deadline_of(args)
    items = [
        NewItem(
            v,
            deadline,
            delay_ms,
            keys[n] if keys else None,
            args.group,
            "replace" if args.replace else "keep",
        )
        for n, v in enumerate(raw)
    ]

    def action(dq: Client) -> int:
        done = dq.enqueue_many(args.queue, items)
        if args.json:
            emit_json(done)
        else:
            for e in done:
                how = "\treplaced" if e.replaced else "\tduplicate" if e.duplicate else ""
                print(f"{e.id}\t{when(e.deadline)}{how}")
        return 0

    return run_remote(args, action)


def get(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        items = dq.dequeue(args.queue, args.count, args.lease_ms, args.wait_ms)
        missing = not items.queue_exists
        paused = None if items or missing else _paused(dq, args.queue)
        # on stderr with --json too: the empty list alone reads as "idle"
        if missing:
            print(
                f"dq get: queue {args.queue} does not exist (yet): nothing is due until a "
                "producer creates it (is the name right? `dq queues` lists them)",
                file=sys.stderr,
            )
        elif paused is not None:
            print(
                f"dq get: queue {args.queue} is paused: it hands nothing out until "
                f"`dq resume {args.queue}` ({plural(paused.due, 'item')} due)",
                file=sys.stderr,
            )
        if args.json:
            emit_json(items)
        elif not items:
            if paused is None and not missing:
                print("(no due items)", file=sys.stderr)
        else:
            from rich.table import Table

            grouped = any(i.group is not None for i in items)
            columns = ("id", "receipt", "deadline", "deliveries", "value")
            table = Table(*columns, *(("group",) if grouped else ()))
            for i in items:
                table.add_row(
                    str(i.id),
                    i.receipt,
                    when(i.deadline),
                    str(i.stats.dequeue_count),
                    value_text(i.value),
                    *((i.group or "-",) if grouped else ()),
                )
            console().print(table)
        # --ack releases only what was printed (written out: a closed pipe fails first)
        failed = []
        if args.ack and items:  # a release refused (the lease ran out): it comes back
            sys.stdout.flush()
            failed = [o for o in dq.release_many(args.queue, items) if not o.ok]
        for o in failed:
            print(f"dq get: item {o.id} not released: {o.error}: {o.message}", file=sys.stderr)
        return 1 if failed else 0

    return run_remote(args, action)


def _paused(dq: Client, queue: str) -> QueueStats | None:
    """The queue's stats if it is paused: an empty answer then means "paused", not
    "nothing due" (one more request, only when nothing came back)."""
    from dq.client import NotFound

    try:
        stats = dq.queue(queue).stats
    except NotFound:
        return None
    return stats if stats.paused else None


def ack(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        dq.release(args.queue, args.id, args.receipt)
        if args.json:
            emit_json({"id": args.id, "ok": True})
        else:
            print(f"released {args.id}")
        return 0

    return run_remote(args, action)


def requeue(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        deadline, delay_ms = deadline_of(args)
        deadline = dq.requeue(
            args.queue, args.id, args.receipt, deadline=deadline, delay_ms=delay_ms
        )
        if args.json:
            emit_json({"id": args.id, "ok": True, "deadline": deadline})
        else:
            print(f"requeued {args.id} (deadline {when(deadline)})")
        return 0

    return run_remote(args, action)


def fail(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        deadline = dq.fail(args.queue, args.id, args.receipt, args.reason)
        if args.json:
            emit_json({"id": args.id, "ok": True, "deadline": deadline})
        else:
            print(f"failed {args.id} (due again {when(deadline)})")
        return 0

    return run_remote(args, action)
