"""The supervisor: starts, kills, pauses and restarts the run's processes.

Every process gets its own process group (so a signal reaches its helpers too, such as
the compaction worker of a ``dq serve``) and ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies
with the runner even when the runner itself is killed. Every wait has a timeout, and
``close`` kills whatever is left; the runner is also pid 1 of its own pid namespace,
where the kernel kills every process when it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

__all__ = ["Proc", "Supervisor", "wait_until"]

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Proc:
    """One supervised process; ``start`` may be called again after it died or was killed."""

    def __init__(
        self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.started_at = 0.0  # monotonic
        self.paused = False

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen is not None else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def start(self) -> None:
        if self.alive():
            return
        self.starts += 1
        with self.log_path.open("ab") as out:
            out.write(f"\n=== start {self.starts} at {time.time():.3f}\n".encode())
            out.flush()
            self.popen = subprocess.Popen(
                self.argv,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_child_setup,
            )
        self.paused = False
        self.started_at = time.monotonic()
        log.info("%s started (pid %d)", self.name, self.popen.pid)

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL the whole group and reap it."""
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL for %.0fs", self.name, self.popen.pid, timeout)
        self.paused = False

    def stop(self) -> None:
        """SIGSTOP: the process keeps its sockets but does nothing."""
        self.signal(signal.SIGSTOP)
        self.paused = True

    def cont(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


class Supervisor:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, Proc] = {}

    def add(self, name: str, argv: Sequence[str], env: Mapping[str, str]) -> Proc:
        proc = Proc(name, argv, env, self.log_dir / f"{name}.log")
        self.procs[name] = proc
        return proc

    def close(self) -> None:
        for proc in self.procs.values():
            proc.kill()


def wait_until(what: str, probe: Callable[[], bool], timeout: float, *, every: float = 0.1) -> None:
    """Poll ``probe`` until true; TimeoutError naming ``what`` otherwise."""
    give_up = time.monotonic() + timeout
    while True:
        try:
            if probe():
                return
        except Exception as exc:  # a probe of a node that is down fails: poll again
            log.debug("%s: %s", what, exc)
        if time.monotonic() > give_up:
            raise TimeoutError(f"{what}: not within {timeout:.0f}s")
        time.sleep(every)
