"""``dq cancel`` and ``dq reschedule``: change the pending item a key names.

The item's key is the idempotency key it was enqueued with (``dq put --key``); it names
the item for the queue's dedup window (``docs/retries.md``, "Items by key"). A leased
item is not changed (the server answers ``item_leased``): the command says so and exits
1, as for every refusal. ``dq peek --key`` (``cli/operate.py``) shows the item.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from dq.cli._deadline import add_deadline_flags, deadline_of
from dq.cli._format import when
from dq.cli._remote import add_common, emit_json, run_remote

if TYPE_CHECKING:
    from dq.client import Client

__all__ = ["register"]


def register(subparsers: Any) -> None:
    help_ = "cancel the pending item a key names (it is never delivered)"
    p = subparsers.add_parser("cancel", help=help_, description=help_)
    p.add_argument("queue")
    p.add_argument("--key", required=True, help="the key the item was enqueued with")
    add_common(p)
    p.set_defaults(func=cancel)

    help_ = "give the pending item a key names a new deadline and/or value"
    p = subparsers.add_parser("reschedule", help=help_, description=help_)
    p.add_argument("queue")
    p.add_argument("--key", required=True, help="the key the item was enqueued with")
    add_deadline_flags(p)
    p.add_argument("--value", help="its new value (text)")
    add_common(p)
    p.set_defaults(func=reschedule)


def cancel(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        item_id = dq.cancel_key(args.queue, args.key)
        if args.json:
            emit_json({"cancelled": item_id, "key": args.key})
        else:
            print(f"cancelled item {item_id} of {args.queue} (key {args.key})")
        return 0

    return run_remote(args, action)


def reschedule(args: argparse.Namespace) -> int:
    deadline, delay_ms = deadline_of(args)
    if deadline is None and delay_ms is None and args.value is None:
        print("dq reschedule: give --delay-ms or --deadline, and/or --value", file=sys.stderr)
        return 2

    def action(dq: Client) -> int:
        done = dq.patch_key(
            args.queue, args.key, deadline=deadline, delay_ms=delay_ms, value=args.value
        )
        if args.json:
            emit_json({"id": done.id, "deadline": done.deadline, "key": args.key})
        else:
            print(f"item {done.id} of {args.queue} (key {args.key}) due {when(done.deadline)}")
        return 0

    return run_remote(args, action)
