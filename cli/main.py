"""The ``dq`` command line: argparse subcommands contributed by plug-in modules.

Each module in ``COMMAND_MODULES`` exposes ``register(subparsers)`` and sets a
``func(args) -> int`` default on the parsers it adds. Adding a command (``dq inspect``,
``dq top`` ...) is a one-line edit to that list. Invariant: modules are imported only
to register; heavy imports (the server, httpx) happen inside the command functions, so
``dq --help`` and client commands start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

COMMAND_MODULES: list[str] = [
    "dq.cli.serve",
    "dq.cli.items",
    "dq.cli.admin",
    "dq.cli.operate",
    "dq.cli.keys",
    "dq.cli.schedules",
    "dq.cli.shm",
    "dq.cli.storage_tools",
]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("deadline-queue")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dq", description="Deadline Queue: a durable deadline queue served over HTTP."
    )
    parser.add_argument("--version", action="version", version=f"dq {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `dq ... | head`: the reader is gone, which is fine
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
