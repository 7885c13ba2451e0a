"""The command-line tests use the same live-server fixtures as the server tests."""

from __future__ import annotations

from tests.server.conftest import queue, server

__all__ = ["queue", "server"]
