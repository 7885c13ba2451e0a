"""Shared pieces of the shared-memory server's tests: an engine served over the rings,
and the bounded wait its tests poll with (the server works on its own threads)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dq.shm.server import ShmServer
from dq.storage import Engine, EngineConfig
from dq.storage.types import FsyncMode, QueueConfig

#: the longest any test here waits for the server
WAIT_S = 10.0


@contextlib.contextmanager
def serving(
    data: Path, fsync: FsyncMode = "never", queues: tuple[str, ...] = (), **config: Any
) -> Iterator[tuple[Engine, ShmServer]]:
    """An engine on ``data`` (``config``: more of its ``EngineConfig``) with ``queues``
    made, and its ring server, both closed after."""
    engine = Engine.open(data, EngineConfig(fsync=fsync, **config))
    for queue in queues:
        engine.put_queue(queue, QueueConfig())
    server = ShmServer(engine, data).start()
    try:
        yield engine, server
    finally:
        server.close()
        engine.close()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Engine, ShmServer]]:
    with serving(tmp_path / "data") as pair:
        yield pair


def eventually(check: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    """Whether ``check`` holds within ``timeout_s``, polling every 10 ms."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.01)
    return check()
