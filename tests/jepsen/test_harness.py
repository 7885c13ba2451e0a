"""The harness cleans up after itself: a run killed from outside leaves no process and
no network namespace behind."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.jepsen.support import REPO, runner_argv, runner_env, why_not

_SKIP = why_not()
# integration: processes in network namespaces
pytestmark = [pytest.mark.integration, pytest.mark.skipif(_SKIP is not None, reason=_SKIP or "")]


def _ours(marker: str) -> list[int]:
    """Pids of this machine whose command line holds ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


@pytest.mark.timeout(240)
def test_a_killed_run_leaves_nothing_behind(tmp_path: Path) -> None:
    """SIGKILL the namespaces' parent mid-run: every etcd and dq of the run dies with
    it (pid namespace), and with them its network namespaces, rules and qdiscs."""
    data_root = tmp_path / "data"
    data_root.mkdir()
    marker = str(data_root) + "/"  # node data directories, not the runner's arguments
    cmd = runner_argv(tmp_path / "out", "--seconds", "60", "--data-root", str(data_root), "--keep-data")  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=REPO, env=runner_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        give_up = time.monotonic() + 120
        while len(_ours(marker)) < 4:  # three etcd members and a dq at least
            assert proc.poll() is None, f"the run ended early: {(tmp_path / 'out' / 'summary.json').read_text()}"  # fmt: skip
            assert time.monotonic() < give_up, "the cluster did not start within 120 s"
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        give_up = time.monotonic() + 20
        while _ours(marker) and time.monotonic() < give_up:
            time.sleep(0.1)
        assert _ours(marker) == [], "processes of the killed run are still alive"
        netns = Path("/run/netns")
        left = [p.name for p in netns.iterdir() if p.name.startswith("h5j")] if netns.exists() else []  # fmt: skip
        assert left == [], f"network namespaces left behind: {left}"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
