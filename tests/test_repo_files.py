"""What a checkout holds: nothing a run produces is committed, and the benchmarks write
their results where git ignores them (a run at the root left results.json there, and it
was committed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.peers import DEFAULT_MD, DEFAULT_OUT

pytestmark = pytest.mark.integration  # asks git

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(autouse=True)
def checkout() -> None:
    if git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip("not a git checkout")


def test_no_results_file_is_committed() -> None:
    tracked = git("ls-files").stdout.splitlines()
    produced = [p for p in tracked if "/" not in p and p.endswith((".json", ".md"))]
    assert produced == ["README.md"], produced  # the root holds no run's output
    assert not [p for p in tracked if Path(p).name.startswith("results.")], tracked


def test_benchmark_results_go_where_git_ignores_them() -> None:
    for path in (DEFAULT_OUT, DEFAULT_MD):
        relative = Path(path).relative_to(ROOT)
        assert git("check-ignore", "-q", str(relative)).returncode == 0, relative
