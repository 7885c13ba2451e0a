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

import errno
import logging
import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from dq.server.app import create_app, drain
from dq.server.descriptors import connection_budget
from dq.server.protocol import protocol_for
from dq.server.settings import Settings

__all__ = ["CannotListen", "DrainingServer", "listen", "serve", "uvicorn_config"]

logger = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """A uvicorn server whose exit signal also drains the app's long-polls."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, url: str = "") -> None:
        super().__init__(config)
        self._app = app
        self._url = url

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started and sockets is not None:  # uvicorn logs no address for given sockets
            logger.info("listening on %s (Ctrl-C or SIGTERM to stop)", self._url)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain(self._app)
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting for requests
        else:
            logger.info("signal %s: draining in-flight requests", signal.Signals(sig).name)
            self.should_exit = True


class CannotListen(Exception):
    """The server's address cannot be bound (in use, not ours, not allowed): said before
    anything is opened, so the engine and the rings are never started for nothing."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Bound sockets for every address of ``host`` (as uvicorn would bind them: address
    reuse on, IPv6 sockets IPv6-only), for uvicorn to serve. Binding here, before the app
    starts, means a port in use is one clear error and not uvicorn's ``[Errno 98]`` after
    the data directory was opened and "Application startup complete" was logged."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as exc:
        raise CannotListen(f"cannot listen on {host}: {exc.strerror}") from exc
    bound: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _name, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise CannotListen(
                        f"port {port} is in use (on {host}): stop what listens there, or "
                        "give another with --port (DQ_PORT)"
                    ) from exc
                raise CannotListen(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    except BaseException:
        for sock in bound:
            sock.close()
        raise
    return bound


def _url(settings: Settings, sockets: list[socket.socket]) -> str:
    scheme = "https" if settings.tls_cert else "http"
    host, port = sockets[0].getsockname()[:2]
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def serve(settings: Settings, *, access_log: bool = False) -> int:
    """Run until SIGTERM/SIGINT. Raises ``CannotListen`` before opening anything when
    the address cannot be bound."""
    sockets = listen(settings.host, settings.port)
    try:
        settings = settings.replace(max_connections=connection_budget(settings.max_connections))
        app = create_app(settings)
        if not settings.tokens and not settings.loopback:
            logger.warning(
                "listening on %s without tokens: anyone who can reach it may read and write "
                "every queue (set DQ_TOKENS or --tokens)",
                settings.host,
            )
        config = uvicorn_config(app, settings, access_log=access_log)
        DrainingServer(config, app, _url(settings, sockets)).run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
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
