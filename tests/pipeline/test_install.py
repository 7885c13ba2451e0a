"""Getting the Spark pipeline running: `make spark`, and what a job says when PySpark or
Java is missing (a newcomer met a bare ``ModuleNotFoundError: No module named 'pyspark'``).

No Spark runs here: the jobs are started as a user starts them, in an environment where
the missing piece cannot be found, and must stop at once saying what to install.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dq.client import Client
from tests.server.live import REPO, LiveServer

# integration: each test starts a job, make or a live dq serve as a process
pytestmark = pytest.mark.integration


def job(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "dq.pipeline.jobs.event_counts", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def without_pyspark(tmp_path: Path) -> dict[str, str]:
    """An environment in which ``import pyspark`` fails as it does where it is not
    installed (a package on PYTHONPATH raising what Python raises then)."""
    stub = tmp_path / "hide" / "pyspark"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n"
    )
    return {**os.environ, "PYTHONPATH": str(stub.parent)}


def test_a_job_without_pyspark_names_the_install_command(
    without_pyspark: dict[str, str], tmp_path: Path
) -> None:
    r = job("--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c"), env=without_pyspark)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr
    line = r.stderr.strip()
    assert line.startswith("event_counts: pyspark not installed for " + sys.executable), line
    assert "`make spark`" in line and "pip install -e '.[spark]'" in line


def test_register_without_pyspark_raises_what_to_install(
    without_pyspark: dict[str, str],
) -> None:
    code = (
        "from dq import pipeline\n"
        "try:\n"
        "    pipeline.register(None)\n"
        "except pipeline.SparkNotInstalled as exc:\n"
        "    print(exc)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=without_pyspark,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert "pyspark not installed" in r.stdout and "`make spark`" in r.stdout


def test_a_job_without_java_says_so(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(tmp_path)  # no java here
    r = job("--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c"), env=env)
    assert r.returncode == 2, r.stderr
    assert "Spark needs Java 17 or later" in r.stderr and "no java on PATH" in r.stderr
    env["JAVA_HOME"] = str(tmp_path / "jdk")
    r = job("--out", str(tmp_path / "o"), "--checkpoint", str(tmp_path / "c"), env=env)
    assert r.returncode == 2 and "has no bin/java" in r.stderr, r.stderr


def test_make_spark_installs_the_spark_lock_with_hashes() -> None:
    """`make spark` (docs/spark.md) installs requirements/spark.txt, hash-checked, on top
    of what `make run` installs; -n prints the commands without running them."""
    r = subprocess.run(
        ["make", "-n", "-B", "spark"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any("--require-hashes -r requirements/serve.txt" in line for line in lines)
    assert any("--require-hashes -r requirements/spark.txt" in line for line in lines)
    assert "make spark" in (REPO / "docs" / "spark.md").read_text()


def test_the_producer_refuses_bad_counts(server: LiveServer, queue: str) -> None:
    for bad in (["--count", "-1"], ["--users", "0"], ["--minutes", "0"]):
        cmd = [sys.executable, "-m", "dq.pipeline.jobs.produce_events", "--url", server.url]
        r = subprocess.run(
            [*cmd, "--queue", queue, *bad], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 2 and "must be" in r.stderr, r.stderr
    with Client(server.url) as dq:
        assert not any(q.name == queue for q in dq.queues())
