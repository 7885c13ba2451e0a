"""What the Jepsen-style tests share: why they cannot run here, how the runner is
started inside fresh namespaces, and where a run's artifacts go."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["REPO", "artifacts_dir", "runner_argv", "runner_env", "why_not"]

REPO = Path(__file__).resolve().parents[2]
_COMMANDS = ("unshare", "ip", "iptables", "tc", "etcd")


def why_not() -> str | None:
    """Why the suite cannot run on this machine, or None."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "needs root on Linux (network namespaces, iptables, tc)"
    missing = [c for c in _COMMANDS if shutil.which(c) is None]
    if missing:
        return f"missing {missing} (Debian: util-linux iproute2 iptables etcd-server)"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--pid", "--fork", "true"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    if probe.returncode != 0:
        return f"cannot make namespaces here: {probe.stderr.strip()}"
    return None


def artifacts_dir() -> Path:
    """A new directory for one run under ``$DQ_JEPSEN_ARTIFACTS`` (default
    ``tests/jepsen/artifacts/``, ignored by git)."""
    root = Path(os.environ.get("DQ_JEPSEN_ARTIFACTS") or REPO / "tests" / "jepsen" / "artifacts")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run = root / f"{stamp}-{os.getpid()}"
    run.mkdir(parents=True)
    return run


def runner_argv(out: Path, *args: str) -> list[str]:
    """The runner as pid 1 of new pid, mount and network namespaces: when ``unshare``
    dies, its child is killed, and with the child every process and namespace of the run."""
    return [
        "unshare", "--net", "--mount", "--pid", "--fork", "--kill-child", "--mount-proc",
        sys.executable, "-m", "tests.jepsen.runner", "--out", str(out), *args,
    ]  # fmt: skip


def runner_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DQ_")}
    env["PYTHONPATH"] = str(REPO)
    return env
