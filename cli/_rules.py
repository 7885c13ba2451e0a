"""A queue's settings as ``dq create`` and ``dq config`` take them: the flags, and the
config they make (``docs/cli.md``; the delivery rules: ``docs/delivery.md``).

``dq create`` replaces the whole config (a flag not given takes its default);
``dq config`` changes only the settings given, on top of the queue's current config.
A limit is a positive number or ``none`` (no limit). The server checks every value
and refuses one out of range in the words every path uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from dq.client import QueueConfig

__all__ = ["add_setting_flags", "describe", "settings_from"]

T = TypeVar("T")


def _or_none(number: Callable[[str], T]) -> Callable[[str], T | None]:
    """How a limit's flag reads its text: a number as ``number`` reads it, or ``none``
    (no limit)."""

    def read(text: str) -> T | None:
        if text.lower() == "none":
            return None
        try:
            return number(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number or 'none': {text!r}") from None

    return read


def _add_limit(
    p: Any, flag: str, help_: str, number: Callable[[str], object] = int, metavar: str = "N|none"
) -> None:
    """A limit's flag: a number or ``none``; not given, it leaves no attribute (``none``
    is a value: no limit)."""
    p.add_argument(
        flag, type=_or_none(number), default=argparse.SUPPRESS, metavar=metavar, help=help_
    )


def add_setting_flags(p: argparse.ArgumentParser, *, create: bool) -> None:
    """The flags of a queue's settings; with ``create`` the plain ones have defaults."""
    keep = "" if create else " (default: keep)"
    p.add_argument("--lease-ms", type=int, help="default lease (ms)" + keep)
    _add_limit(p, "--max-deliveries", "dead-letter an item after this many deliveries" + keep)
    p.add_argument("--dead-letter-queue", help="where dead letters go (default QUEUE.dlq)")
    p.add_argument("--dedup-window-ms", type=int, help="remember keys this long (0: off)" + keep)
    rules = p.add_argument_group("delivery rules (docs/delivery.md)")
    _add_limit(
        rules,
        "--group-limit",
        "at most N items of one group leased at once (1: each group in order)",
    )
    _add_limit(rules, "--leased-limit", "at most N items leased at once")
    rules.add_argument(
        "--fair",
        action=argparse.BooleanOptionalAction,
        help="serve the groups that have due items in turn",
    )
    _add_limit(
        rules,
        "--rate-limit",
        "at most this many deliveries a second (a token bucket)",
        float,
        "PER_SECOND|none",
    )
    rules.add_argument(
        "--burst", type=int, help="tokens the bucket holds (default: a second's worth)"
    )
    rules.add_argument(
        "--per-group",
        action=argparse.BooleanOptionalAction,
        help="a rate limit of its own for each group",
    )


def settings_from(args: argparse.Namespace, current: QueueConfig) -> QueueConfig:
    """``current`` with the settings the flags give (``dq create``: on the defaults)."""
    from dq.client import RateLimit

    given: dict[str, Any] = {}
    for flag, field in (
        ("lease_ms", "default_lease_ms"),
        ("dedup_window_ms", "dedup_window_ms"),
        ("dead_letter_queue", "dead_letter_queue"),
        ("fair", "fair"),
    ):
        if getattr(args, flag) is not None:
            given[field] = getattr(args, flag)
    for flag in ("max_deliveries", "group_limit", "leased_limit"):
        if hasattr(args, flag):
            given[flag] = getattr(args, flag)
    rate = current.rate_limit
    if hasattr(args, "rate_limit"):
        per_second = args.rate_limit
        if per_second is None:
            rate = None
        else:
            burst = args.burst if args.burst is not None else max(1, math.ceil(per_second))
            rate = RateLimit(per_second, burst, bool(args.per_group))
    elif rate is not None and (args.burst is not None or args.per_group is not None):
        rate = RateLimit(
            rate.per_second,
            args.burst if args.burst is not None else rate.burst,
            rate.per_group if args.per_group is None else args.per_group,
        )
    given["rate_limit"] = rate
    return dataclasses.replace(current, **given)


def describe(c: QueueConfig) -> str:
    """The delivery rules in a few words (``-`` for none)."""
    parts = []
    if c.group_limit is not None:
        parts.append(f"group limit {c.group_limit}")
    if c.leased_limit is not None:
        parts.append(f"leased limit {c.leased_limit}")
    if c.fair:
        parts.append("fair")
    r = c.rate_limit
    if r is not None:
        each = " per group" if r.per_group else ""
        parts.append(f"rate {r.per_second:g}/s{each} (burst {r.burst})")
    return ", ".join(parts) or "-"
