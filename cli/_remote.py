"""What the client-side ``dq`` commands share: ``--url``/``--token``/``--json`` and output.

Human output goes through ``rich`` tables; ``--json`` prints one JSON document per
command for scripts. Invariant: a ``ClientError`` becomes one line on stderr and exit
status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dq.client import Client

__all__ = ["add_common", "console", "emit_json", "run_remote", "value_text"]

DEFAULT_URL = "http://127.0.0.1:8080"


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("DQ_URL", DEFAULT_URL),
        help="server URL; the nodes of a replicated deployment comma-separated, the "
        "leader is found and followed (DQ_URL)",
    )
    p.add_argument("--token", default=os.environ.get("DQ_TOKEN"), help="bearer token (DQ_TOKEN)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def console() -> Any:
    """A rich console; wide when piped, so names and numbers are never cut. No markup
    and no emoji codes: cells hold values as stored (``[/x]`` in a value was a
    ``MarkupError`` after the items were leased, ``[b]x[/b]`` printed ``x``)."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False)


def value_text(value: bytes) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(value).decode("ascii")


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, bytes):
        return value_text(obj)
    if isinstance(obj, list | tuple):
        return [_plain(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def emit_json(obj: Any) -> None:
    print(json.dumps(_plain(obj), indent=2, sort_keys=True))


def run_remote(args: argparse.Namespace, action: Callable[[Client], int]) -> int:
    from dq.client import Client, ClientError

    try:
        with Client(args.url, token=args.token, retries=1) as dq:
            return action(dq)
    except ClientError as exc:
        print(f"dq {args.command}: {exc}", file=sys.stderr)
        return 1
