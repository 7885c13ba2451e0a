"""What the Spark pipeline needs beyond serving, and the one message saying how to get it.

``make run`` installs what serving needs; PySpark, pyarrow and pandas (the ``spark``
extra) come with ``make spark`` (or ``pip install -e '.[spark]'``), and Spark itself runs
on Java 17 or later. Without them a job failed with a bare ``ModuleNotFoundError: No
module named 'pyspark'``, or Spark's "Java gateway process exited" after a long wait;
the entry points (``register``, the jobs' ``main``) check first and name the fix.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys

from dq.pipeline.errors import SparkNotInstalled

__all__ = ["INSTALL_SPARK", "require_java", "require_spark"]

#: the command that installs the Spark extra, as docs/spark.md gives it
INSTALL_SPARK = "`make spark` in the repository (or `pip install -e '.[spark]'`)"

#: the modules of the ``spark`` extra the data source imports
_SPARK_MODULES = ("pyspark", "pyarrow", "pandas")


def require_spark() -> None:
    """Raise ``SparkNotInstalled`` naming the missing modules and ``INSTALL_SPARK``."""
    missing = []
    for module in _SPARK_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise SparkNotInstalled(
            f"{', '.join(missing)} not installed for {sys.executable}: the Spark pipeline "
            f"needs the spark extra; install it with {INSTALL_SPARK}"
        )


def require_java() -> None:
    """Raise ``SparkNotInstalled`` when no ``java`` would start Spark's JVM (PySpark runs
    ``$JAVA_HOME/bin/java``, else the ``java`` on PATH)."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if java is None or not os.access(java, os.X_OK):
        where = f"JAVA_HOME={home} has no bin/java" if home else "no java on PATH"
        raise SparkNotInstalled(
            f"Spark needs Java 17 or later and found none ({where}): install a JRE "
            "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
        )
