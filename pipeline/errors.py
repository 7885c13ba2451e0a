"""The one error base of the pipeline package.

PipelineError
├── OptionError        a missing or malformed data source option
└── SparkNotInstalled  PySpark (the spark extra) or Java is missing; says how to get it
"""

from __future__ import annotations

__all__ = ["OptionError", "PipelineError", "SparkNotInstalled"]


class PipelineError(Exception):
    """Base of every error the ``dq`` data source raises itself."""


class OptionError(PipelineError, ValueError):
    """A data source option is missing or malformed; the message names the option."""


class SparkNotInstalled(PipelineError, ImportError):
    """The Spark extra (pyspark, pyarrow, pandas) or Java is missing; the message names
    what is missing and how to install it (``dq.pipeline.install``)."""
