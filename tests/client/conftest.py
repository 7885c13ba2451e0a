"""The client tests use the same live-server fixtures as the server tests."""

from __future__ import annotations

from tests.server.conftest import dq, queue, server

__all__ = ["dq", "queue", "server"]
