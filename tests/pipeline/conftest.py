"""Fixtures of the pipeline tests: a real ``dq serve`` and one local Spark per module.

Spark runs on ``local[2,3]`` (two cores, a task may fail up to three times, so failed
tasks are retried) with ``PYSPARK_PYTHON`` pointing at this interpreter: without it the
workers use the ``python3`` on PATH and die with "Python worker exited unexpectedly".
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.server.live import LiveServer, live_server
from tests.tiers import starts_servers

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="module")
@starts_servers
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("dq") / "data") as s:
        yield s


@pytest.fixture
def queue(request: pytest.FixtureRequest) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:100]


@pytest.fixture(scope="module")
@starts_servers
def spark() -> Iterator[SparkSession]:
    pytest.importorskip("pyspark")
    from pyspark.sql import SparkSession

    from dq import pipeline

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,3]")
        .appName("dq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    pipeline.register(session)
    try:
        yield session
    finally:
        session.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
