"""A real dq server inside the test process, for tests that must reach its engine.

Everything ``dq serve`` runs — uvicorn, our HTTP protocol with the fast path
(``server/protocol.py``), the app with its lifespan (engine, shm server, consumer
groups) — but in a thread of the test, so a test can call e.g.
``server.engine.set_role(False, leader_url)`` to make it a follower. Clients reach it
over real sockets on 127.0.0.1. Every wait has a timeout; ``stop()`` ends the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn

from dq.server.app import create_app
from dq.server.runner import uvicorn_config
from dq.server.settings import Settings
from tests.server.live import free_port

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["ThreadedServer", "threaded_server"]


class ThreadedServer:
    def __init__(self, data_dir: Path, **settings: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.settings = Settings(
            data_dir=str(data_dir), host="127.0.0.1", port=self.port, **settings
        ).validated()
        self.app = create_app(self.settings)
        config = uvicorn_config(self.app, self.settings, log_level="warning")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"dq-test-{self.port}", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self.server.serve())
        except BaseException as exc:  # reported by start()
            self._error = exc

    def start(self, timeout: float = 30.0) -> ThreadedServer:
        self._thread.start()
        give_up = time.monotonic() + timeout
        while not (self.server.started and self.app.state.service is not None):
            if not self._thread.is_alive() or time.monotonic() > give_up:
                self.stop()
                raise RuntimeError(f"server on {self.url} did not start: {self._error!r}")
            time.sleep(0.02)
        return self

    @property
    def engine(self) -> Engine:
        engine: Engine = self.app.state.service.engine
        return engine

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            self.server.force_exit = True
            self._thread.join(5)


@contextlib.contextmanager
def threaded_server(data_dir: Path, **settings: Any) -> Iterator[ThreadedServer]:
    server = ThreadedServer(data_dir, **settings).start()
    try:
        yield server
    finally:
        server.stop()
