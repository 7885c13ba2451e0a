"""What the client-side ``dq`` commands share: ``--url``/``--token``/``--json`` and output.

Human output goes through ``rich`` tables; ``--json`` prints one JSON document per
command for scripts. Invariant: a ``ClientError`` becomes one line on stderr and exit
status 1 (2 for usage errors), never a traceback.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import errno
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dq.client import Client

__all__ = ["add_common", "console", "emit_json", "run_remote", "value_text"]

DEFAULT_URL = "http://127.0.0.1:8080"
_UNREACHABLE = frozenset({errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH})


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

    problem = _url_problem(args.url)
    if problem is not None:
        print(f"dq {args.command}: {problem}", file=sys.stderr)
        return 2
    try:
        with Client(args.url, token=args.token, retries=1) as dq:
            return action(dq)
    except ClientError as exc:
        print(f"dq {args.command}: {_explain(args.url, exc)}", file=sys.stderr)
        return 1


def _urls(url: str) -> list[str]:
    return [u.strip().rstrip("/") for u in url.split(",") if u.strip()]


def _url_problem(url: str) -> str | None:
    """A URL ending in ``/v1``: the client adds the API's ``/v1`` itself, so every call
    would go to ``/v1/v1/...`` and be answered 404. Said before anything is sent."""
    from urllib.parse import urlsplit

    for u in _urls(url):
        parts = urlsplit(u)
        if parts.path.rstrip("/").endswith("/v1"):
            root = u[: len(u) - len(parts.path)]
            return (
                f"{u}: give the server's address without the API's path /v1 (the "
                f"commands add it): --url {root} or DQ_URL={root}"
            )
    return None


def _explain(url: str, exc: Exception) -> str:
    """What a failed call means to the person who typed the command, in one line.

    No server listening (every node refused or could not be reached): one line naming
    the URL and what to do, not the transport's story of each try. A route answered 404
    by a URL with a path: the path is the likely problem (dq serves at the root)."""
    from urllib.parse import urlsplit

    from dq.client import NotFound, TransportError

    why = _not_connected(exc) if isinstance(exc, TransportError) else None
    if why is not None:
        return f"no dq server at {', '.join(_urls(url))} — {why} set --url or DQ_URL"
    if isinstance(exc, NotFound) and exc.code == "not_found":
        with_path = [u for u in _urls(url) if urlsplit(u).path not in ("", "/")]
        if with_path:
            return (
                f"{with_path[0]} answered 404 not_found: no dq API under the path "
                f"{urlsplit(with_path[0]).path} (dq serves at the root of its port; set "
                "--url or DQ_URL to the address alone, unless a proxy serves it there)"
            )
    return str(exc)


def _not_connected(exc: BaseException) -> str | None:
    """Why no connection was made at all (refused, unreachable, unknown host), or None:
    then nothing was sent, so nothing can have happened."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, socket.gaierror):
            return "its host name does not resolve;"
        if isinstance(cause, OSError) and cause.errno in _UNREACHABLE:
            return "is it running?"
        cause = cause.__cause__
    return None
