"""``dq inspect PATH`` and ``dq verify DATA_DIR``: offline views of the data files."""

from __future__ import annotations

import argparse
import os
import sys

from dq.cli._format import plural

__all__ = ["register"]


def _inspect(args: argparse.Namespace) -> int:
    from dq.storage.errors import StorageError
    from dq.storage.tools import inspect_file

    try:
        for line in inspect_file(args.path, entries=args.entries):
            print(line)
    except (StorageError, OSError) as exc:
        print(f"dq inspect: {exc}", file=sys.stderr)
        return 1
    return 0


def _verify(args: argparse.Namespace) -> int:
    from dq.storage.tools import verify_data_dir

    if not os.path.isdir(args.data_dir):
        print(f"dq verify: {args.data_dir}: no such data directory", file=sys.stderr)
        return 1
    problems = verify_data_dir(args.data_dir)
    for p in problems:
        print(p)
    damage = [p for p in problems if p.damage]
    print(
        f"{len(damage)} damaged, {plural(len(problems) - len(damage), 'note')}"
        if problems
        else "ok: no damage found"
    )
    return 1 if damage else 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("inspect", help="describe a log or segment file")
    p.add_argument("path", help="a *.log, *.log_ro or *.seg file")
    p.add_argument("--entries", action="store_true", help="print every entry")
    p.set_defaults(func=_inspect)
    p = subparsers.add_parser(
        "verify", help="check every checksum and invariant of a data directory"
    )
    p.add_argument("data_dir", help="the server's --data-dir (best with the server stopped)")
    p.set_defaults(func=_verify)
