"""Run the service under uvicorn, programmatically, with a draining shutdown.

uvicorn runs our HTTP protocol (``server/protocol.py``: the fast path and the
connection limits) and, with ``DQ_TLS_CERT``/``DQ_TLS_KEY``, serves HTTPS itself.
On SIGTERM/SIGINT uvicorn stops accepting connections and waits (up to
``settings.shutdown_timeout_s``) for requests in flight; our signal hook first ends
every long-poll so waiting consumers get their (possibly empty) answer at once.
Then the lifespan closes the engine, which syncs. Invariant: a graceful stop exits
with status 0; the signal is not re-raised after the drain.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import uvicorn
from fastapi import FastAPI

from dq.server.app import create_app, drain
from dq.server.descriptors import connection_budget
from dq.server.protocol import protocol_for
from dq.server.settings import Settings

__all__ = ["DrainingServer", "serve", "uvicorn_config"]

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signal also drains the app's long-polls."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain(self._app)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for requests
        else:
            logger.info("signal %s: draining in-flight requests", signal.Signals(sig).name)
            self.should_exit = True


def serve(settings: Settings, *, access_log: bool = False) -> int:
    settings = settings.replace(max_connections=connection_budget(settings.max_connections))
    app = create_app(settings)
    if not settings.tokens and not settings.loopback:
        logger.warning(
            "listening on %s without tokens: anyone who can reach it may read and write "
            "every queue (set DQ_TOKENS or --tokens)",
            settings.host,
        )
    DrainingServer(uvicorn_config(app, settings, access_log=access_log), app).run()
    return 0


def uvicorn_config(
    app: FastAPI, settings: Settings, *, access_log: bool = False, log_level: str | None = None
) -> uvicorn.Config:
    """How uvicorn serves ``app``: the one place the server's socket, protocol and TLS
    are configured (``dq serve`` and the in-process servers of tests and benchmarks)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level or settings.log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=int(settings.shutdown_timeout_s),
        server_header=False,
        # The fast path and the connection limits live in the protocol.
        http=protocol_for(app, settings),
        # No route speaks WebSocket: a request asking to upgrade is an ordinary request
        # (the fast path and the framework answer it alike), not a connection handed to
        # a WebSocket library that would leave it unanswered.
        ws="none",
        # Nothing reads the client address; the proxy-headers layer would wrap every
        # request for nothing.
        proxy_headers=False,
        ssl_certfile=settings.tls_cert or None,
        ssl_keyfile=settings.tls_key or None,
    )
