"""The two test tiers, and the guard that keeps a fast test fast.

``make check`` runs ``pytest -m "not integration"``: lint, types and every test that
starts no other process and no server, in a few minutes. ``make test`` runs everything.
A test that starts a subprocess (``subprocess``, ``multiprocessing``, ``os.fork``, a
``dq serve``, etcd, Spark's JVM) or a TCP server (a socket that listens on a port,
uvicorn) is an *integration* test and carries the ``integration`` marker: on its
module (``pytestmark``), on itself, or through a fixture declared with
:func:`starts_servers`, which marks every test that uses it.

The marker is only worth something if it cannot be forgotten, so :class:`Guard` refuses,
while a test without the marker runs, each way a Python process starts another process
or listens on a TCP port, and ``tests/conftest.py`` fails that test naming what it
started and where. Listening on a Unix socket (the shared-memory rings' attach socket)
is allowed: it opens nothing to the network and costs nothing to set up.
"""

from __future__ import annotations

import _posixsubprocess
import contextlib
import os
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import uvicorn

__all__ = ["INTEGRATION", "Guard", "Start", "StartRefused", "starts_servers", "uses_servers"]

INTEGRATION = "integration"
ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve()

F = TypeVar("F", bound=Callable[..., Any])
_MARK = "__dq_starts_servers__"
_INHERITED = object()


def starts_servers(fixture: F) -> F:
    """Declare that a fixture starts a process or a server: its users are integration tests.

    Put it under ``@pytest.fixture``; ``tests/conftest.py`` marks every test whose
    fixtures (directly or through other fixtures) include one so declared.
    """
    setattr(fixture, _MARK, True)
    return fixture


def uses_servers(fixture_functions: list[Callable[..., Any]]) -> bool:
    """Whether any of these fixture functions was declared with :func:`starts_servers`."""
    return any(getattr(f, _MARK, False) for f in fixture_functions)


class StartRefused(PermissionError):
    """A test without the ``integration`` marker tried to start a process or a server.

    An ``OSError``, as the refusal of a real system call would be, so that code which
    cleans up after a failed call (``socket.create_server`` closing its socket) does.
    """


@dataclass(frozen=True)
class Start:
    """One refused start: what it was and the repository's code lines that asked for it."""

    what: str
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.what}, from\n" + "\n".join(f"    {line}" for line in self.where)


def _our_frames() -> tuple[str, ...]:
    """The stack's lines in our code (tests and product, not Python's or a library's),
    innermost last."""
    libraries = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    lines = []
    for frame in traceback.extract_stack():
        if frame.filename.startswith(("<", *libraries)) or Path(frame.filename) == HERE:
            continue
        path = Path(frame.filename)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        lines.append(f"{shown}:{frame.lineno}: {(frame.line or '').strip()}")
    return tuple(lines[-4:])


def _command(args: Any) -> str:
    if isinstance(args, (str, bytes, os.PathLike)):
        return repr(os.fsdecode(args))
    try:
        return repr([os.fsdecode(a) for a in args])
    except TypeError:
        return repr(args)


class Guard:
    """Refuses, while armed, every way this process starts a process or a TCP server.

    ``install`` wraps the few functions that everything else goes through:
    ``subprocess.Popen._execute_child`` (``subprocess``, ``asyncio`` subprocesses,
    ``os.popen``), ``_posixsubprocess.fork_exec`` (``multiprocessing``'s spawn and
    forkserver), ``os.fork``/``os.forkpty`` (``multiprocessing``'s fork, ``os.spawn*``,
    ``pty``), ``os.posix_spawn[p]``, ``os.system``, ``socket.socket.listen`` (``socket``,
    ``socketserver``, ``asyncio`` servers) and ``uvicorn.Server.startup``. A refused start
    raises :class:`StartRefused` (so nothing is left running) and is recorded, so the
    test fails even if its code caught the error. Guards nest: one installed on top of
    another is asked first and removed first.
    """

    def __init__(self) -> None:
        self.armed = False
        self._starts: list[Start] = []
        self._lock = threading.Lock()
        self._saved: list[tuple[Any, str, Any]] = []

    # -- arming ------------------------------------------------------------------------

    @contextlib.contextmanager
    def arming(self, armed: bool) -> Iterator[list[Start]]:
        """Arm (or not) for a block; yields the list the block's refused starts go to."""
        self.armed = armed
        starts: list[Start] = []
        with self._lock:
            self._starts = starts
        try:
            yield starts
        finally:
            self.armed = False

    def _refuse(self, what: str) -> None:
        start = Start(what, _our_frames())
        with self._lock:
            self._starts.append(start)
        raise StartRefused(f"a test not marked integration started {start}")

    # -- installing --------------------------------------------------------------------

    def install(self) -> None:
        assert not self._saved, "installed twice"
        guard = self

        def patch(owner: Any, name: str, wrapper: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            # an inherited method (socket.socket.listen is _socket.socket's) is put back
            # by deleting the override, so the class is left as it was
            owned = not isinstance(owner, type) or name in vars(owner)
            self._saved.append((owner, name, original if owned else _INHERITED))
            setattr(owner, name, wrapper(original))

        def execute_child(original: Any) -> Any:
            def _execute_child(popen: subprocess.Popen[Any], args: Any, *a: Any, **k: Any) -> Any:
                if guard.armed:
                    guard._refuse(f"a subprocess {_command(args)}")
                return original(popen, args, *a, **k)

            return _execute_child

        def spawning(what: str) -> Callable[[Any], Any]:
            def wrapper(original: Any) -> Any:
                def guarded(*a: Any, **k: Any) -> Any:
                    if guard.armed:
                        guard._refuse(what.format(*(_command(x) for x in a[:1])))
                    return original(*a, **k)

                return guarded

            return wrapper

        def listen(original: Any) -> Any:
            def guarded(sock: socket.socket, *a: Any) -> Any:
                if guard.armed and sock.family in (socket.AF_INET, socket.AF_INET6):
                    try:
                        host, port = sock.getsockname()[:2]
                        address = f"{host}:{port}"
                    except OSError:
                        address = "?"
                    sock.close()  # nothing of a refused server is left open
                    guard._refuse(f"a TCP server socket listening on {address}")
                return original(sock, *a)

            return guarded

        def startup(original: Any) -> Any:
            async def guarded(server: uvicorn.Server, *a: Any, **k: Any) -> Any:
                if guard.armed:
                    config = server.config
                    guard._refuse(f"a uvicorn server ({config.host}:{config.port})")
                return await original(server, *a, **k)

            return guarded

        patch(subprocess.Popen, "_execute_child", execute_child)
        patch(_posixsubprocess, "fork_exec", spawning("a process (fork_exec {})"))
        patch(os, "fork", spawning("a process (os.fork)"))
        patch(os, "forkpty", spawning("a process (os.forkpty)"))
        patch(os, "posix_spawn", spawning("a process (os.posix_spawn {})"))
        patch(os, "posix_spawnp", spawning("a process (os.posix_spawnp {})"))
        patch(os, "system", spawning("a process (os.system {})"))
        patch(socket.socket, "listen", listen)
        patch(uvicorn.Server, "startup", startup)

    def uninstall(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            if original is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, original)
