"""The one error base of the pipeline package.

PipelineError
└── OptionError      a missing or malformed data source option
"""

from __future__ import annotations

__all__ = ["OptionError", "PipelineError"]


class PipelineError(Exception):
    """Base of every error the ``dq`` data source raises itself."""


class OptionError(PipelineError, ValueError):
    """A data source option is missing or malformed; the message names the option."""
