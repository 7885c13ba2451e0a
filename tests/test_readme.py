"""The README's "first ten minutes" worker runs as written against a live server.

A newcomer copies that snippet first; if the client's names or the consumer helper drift
from it, this test says so before they do.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.live import REPO, live_server


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


@pytest.mark.integration
def test_readme_worker_runs(tmp_path: Path) -> None:
    blocks = _python_blocks((REPO / "README.md").read_text())
    assert blocks, "the README lost its worker example"
    worker = blocks[0]
    assert "http://127.0.0.1:8080" in worker
    with live_server(tmp_path / "data") as server:
        code = worker.replace("http://127.0.0.1:8080", server.url)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
        )
    assert done.returncode == 0, done.stderr
    assert "sending welcome@example.com" in done.stdout
    assert "released=1" in done.stdout.replace(" ", "")


def test_readme_names_both_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert "make run" in readme and "make test" in readme
    assert ".venv/bin" in readme
