"""The real server (uvicorn with dq's HTTP protocol, as ``dq serve`` runs it) in a thread
of the test process, on 127.0.0.1, so a test can give its app a replication role and
run coroutines on the server's own event loop.

Every wait has a timeout; ``stop()`` ends the server and joins its thread.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import uvicorn

from dq.server.app import create_app
from dq.server.runner import uvicorn_config
from dq.server.settings import Settings
from dq.storage import Engine
from tests.server.live import free_port

__all__ = ["InProcessServer", "in_process_server"]

T = TypeVar("T")


class InProcessServer:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        # always a free port: Settings' default (8080) may be taken on a shared machine
        self.settings = settings.replace(port=free_port())
        self.app = create_app(self.settings, engine)
        self.engine = engine
        self.url = f"http://127.0.0.1:{self.settings.port}"
        config = uvicorn_config(
            self.app, self.settings.replace(shutdown_timeout_s=5.0), log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._run, name="test-server", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.server.serve())
        finally:
            self.loop.close()

    def start(self, timeout: float = 20.0) -> InProcessServer:
        self.thread.start()
        give_up = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > give_up:
                raise RuntimeError("the in-process server did not start")
            time.sleep(0.02)
        return self

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 20.0) -> T:
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(make(), self.loop).result(timeout)

    def on_loop(self, fn: Callable[[], T], timeout: float = 20.0) -> T:
        """Run a plain function on the server's loop."""

        async def run() -> T:
            return fn()

        return self.call(run, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the in-process server did not stop"


@contextmanager
def in_process_server(settings: Settings, engine: Engine) -> Iterator[InProcessServer]:
    server = InProcessServer(settings, engine).start()
    try:
        yield server
    finally:
        server.stop()
