"""``make run`` on a fresh checkout, with stand-ins for Python and pip (no network, no
real install): it says what it is doing before the quiet pip install, then serves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # runs make

ROOT = Path(__file__).resolve().parents[1]

#: python3's stand-in: ``-m venv DIR`` makes DIR/bin/python (this script) and DIR/bin/dq;
#: every other call is printed, so the order of what ran shows in make's output
PYTHON = """#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin"
    cp "$0" "$3/bin/python"
    printf '#!/bin/sh\\necho "stand-in: dq $*"\\n' > "$3/bin/dq"
    chmod +x "$3/bin/dq"
    exit 0
fi
echo "stand-in: python $*"
"""


def test_make_run_says_what_it_installs_before_the_quiet_install(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("no make")
    python = tmp_path / "python3"
    python.write_text(PYTHON)
    python.chmod(0o755)
    venv = tmp_path / "venv"
    done = subprocess.run(
        ["make", "--no-print-directory", "run", f"VENV={venv}", f"PYTHON={python}"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    said = [n for n, line in enumerate(lines) if line.startswith("Installing dq and what")]
    pip = [n for n, line in enumerate(lines) if line.startswith("stand-in: python -m pip")]
    assert said and pip and said[0] < pip[0], lines
    assert lines[said[0]] == (
        f"Installing dq and what serving needs into {venv} (pip, quietly; ~15 s the first time) ..."
    )
    assert all("-qq" in lines[n] for n in pip)  # the install itself stays quiet
    assert lines[-1] == "stand-in: dq serve"
