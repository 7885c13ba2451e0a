"""``dq schedule put|list|show|delete|pause|resume|run``: a queue's schedules.

A thin shell over the client's schedule calls (``docs/schedules.md``): ``put`` makes a
schedule or replaces its definition; ``show`` prints one with its next runs, ``list``
the queue's as a table. Times print as local ISO 8601 (``--json``: ms). ``--at``,
``--start`` and ``--end`` go to the server as given (ms, or ISO 8601 text; without an
offset a wall-clock time of ``--timezone``), which judges them: a definition that cannot
fire is one line on stderr naming what is wrong, exit 1, as every refusal is.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from dq.cli._format import age, plural, when
from dq.cli._remote import add_common, console, emit_json, run_remote, value_text

if TYPE_CHECKING:
    from dq.client import Client, Schedule

__all__ = ["describe", "register"]


def _time(text: str) -> int | str:
    """An ``--at``/``--start``/``--end`` value: ms when it is a number, else the text."""
    return int(text) if text.isdigit() else text


def register(subparsers: Any) -> None:
    top = subparsers.add_parser(
        "schedule",
        help="a queue's schedules: put, list, show, delete, pause, resume, run",
        description="Schedules enqueue one item per tick into their queue: a cron "
        "expression in a time zone, every N ms, or once (docs/schedules.md).",
    )
    sub = top.add_subparsers(dest="action", metavar="ACTION", required=True)

    def named(name: str, help_: str, func: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("queue")
        p.add_argument("name")
        add_common(p)
        p.set_defaults(func=func)
        return p

    p = named("put", "make a schedule, or replace its definition (it keeps what it fired)", put)
    when_ = p.add_mutually_exclusive_group(required=True)
    when_.add_argument("--cron", help="5 fields, or 6 with the seconds first")
    when_.add_argument("--every-ms", type=int, help="fire every this many ms")
    when_.add_argument("--at", type=_time, help="fire once: ISO 8601 or ms")
    p.add_argument("--timezone", default="UTC", help="IANA zone of the cron's wall clock")
    p.add_argument("--value", default="", help="the value of each item (text)")
    p.add_argument("--group", help="the group of each item")
    p.add_argument(
        "--catch-up",
        choices=("skip", "latest", "all"),
        default="latest",
        help="what fires of the ticks missed while no server ran",
    )
    p.add_argument("--start", type=_time, help="no tick before this (ISO 8601 or ms)")
    p.add_argument("--end", type=_time, help="no tick after this (ISO 8601 or ms)")
    p.add_argument("--paused", action="store_true", help="make it paused")
    p = sub.add_parser("list", help="the queue's schedules", description="The queue's schedules")
    p.add_argument("queue")
    add_common(p)
    p.set_defaults(func=list_)
    named("show", "a schedule: its definition, what it fired, its next runs", show)
    named("delete", "delete a schedule (the items it enqueued stay)", delete)
    named("pause", "a paused schedule fires nothing", pause)
    named("resume", "fire again from the next tick", resume)
    named("run", "enqueue the schedule's item now, outside its ticks", run)


def _when(s: Schedule) -> str:
    if s.cron is not None:
        return f"cron {s.cron} ({s.timezone})"
    if s.every_ms is not None:
        return f"every {age(s.every_ms)}"
    return f"once at {when(s.at)}"


def describe(s: Schedule) -> list[str]:
    """A schedule in a few lines, as ``put``, ``show``, ``pause`` and ``resume`` print it."""
    state = " (paused)" if s.paused else ""
    lines = [f"schedule {s.name} of {s.queue}: {_when(s)}, catch_up {s.catch_up}{state}"]
    item = f"  each item: value {value_text(s.value)[:60]!r}"
    lines.append(item + (f", group {s.group}" if s.group else ""))
    if s.start is not None or s.end is not None:
        lines.append(f"  from {when(s.start)} to {when(s.end)}")
    last = "none yet" if s.last_tick is None else when(s.last_tick)
    late = "" if s.lateness_ms is None else f", {s.lateness_ms} ms late"
    lines.append(f"  fired {plural(s.fired, 'tick')}; last {last}{late}")
    if s.next:
        lines.append("  next: " + ", ".join(when(t) for t in s.next))
    elif not s.paused:
        lines.append("  next: none (it has fired its last)")
    return lines


def _print(args: argparse.Namespace, s: Schedule) -> int:
    if args.json:
        emit_json(s)
    else:
        print("\n".join(describe(s)))
    return 0


def put(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        s = dq.put_schedule(
            args.queue,
            args.name,
            cron=args.cron,
            every_ms=args.every_ms,
            at=args.at,
            timezone=args.timezone,
            value=args.value,
            group=args.group,
            catch_up=args.catch_up,
            start=args.start,
            end=args.end,
            paused=args.paused,
        )
        return _print(args, s)

    return run_remote(args, action)


def list_(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        found = dq.list_schedules(args.queue)
        if args.json:
            emit_json(found)
            return 0
        if not found:
            print(f"queue {args.queue} has no schedules")
            return 0
        from rich.table import Table

        table = Table("name", "when", "next run", "last fired", "fired", "lateness", "paused")
        for s in found:
            table.add_row(
                s.name,
                _when(s),
                when(s.next[0]) if s.next else "-",
                when(s.last_tick),
                str(s.fired),
                "-" if s.lateness_ms is None else f"{s.lateness_ms} ms",
                "yes" if s.paused else "",
            )
        console().print(table)
        return 0

    return run_remote(args, action)


def show(args: argparse.Namespace) -> int:
    return run_remote(args, lambda dq: _print(args, dq.get_schedule(args.queue, args.name)))


def delete(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        dq.delete_schedule(args.queue, args.name)
        if args.json:
            emit_json({"deleted": args.name})
        else:
            print(f"deleted schedule {args.name} of {args.queue} (its items stay)")
        return 0

    return run_remote(args, action)


def pause(args: argparse.Namespace) -> int:
    return run_remote(args, lambda dq: _print(args, dq.pause_schedule(args.queue, args.name)))


def resume(args: argparse.Namespace) -> int:
    return run_remote(args, lambda dq: _print(args, dq.resume_schedule(args.queue, args.name)))


def run(args: argparse.Namespace) -> int:
    def action(dq: Client) -> int:
        done = dq.run_schedule(args.queue, args.name)
        if args.json:
            emit_json(done)
        else:
            print(f"enqueued item {done.id} into {args.queue} (key {done.key})")
        return 0

    return run_remote(args, action)
