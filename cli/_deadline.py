"""The ``--delay-ms``/``--deadline`` pair of the commands that set an item's deadline
(``dq put``, ``dq requeue``, ``dq reschedule``): the flags and how they are read.

In one place so that every such command takes a time the same way and says so in the
same words (``docs/cli.md``, "Times"): ``--deadline`` takes what ``parse_when`` reads,
and a relative time goes to the server as a delay, added to its own clock.
"""

from __future__ import annotations

import argparse

from dq.cli._format import When, parse_when

__all__ = ["add_deadline_flags", "deadline_of"]


def add_deadline_flags(p: argparse.ArgumentParser) -> None:
    """``--delay-ms N`` or ``--deadline TIME``, one of them at most."""
    group = p.add_mutually_exclusive_group()
    group.add_argument("--delay-ms", type=int, help="due this many ms from now")
    group.add_argument(
        "--deadline",
        type=parse_when,
        metavar="TIME",
        help="due at TIME: ISO 8601 (2026-12-01T09:30, local time unless it has an "
        "offset or Z), relative (+90s, +5m, +2h, +1d) or ms since the epoch",
    )


def deadline_of(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """(deadline, delay_ms) from the flags: at most one of them is not None."""
    given: When | None = args.deadline
    if given is None:
        return None, args.delay_ms
    return given.deadline, given.delay_ms
