"""The app factory: ``create_app(settings, engine=None)`` wires routers, errors, limits.

It only wires: routes live in ``server/routers/``, errors in ``server/errors.py``,
resources in ``server/lifespan.py``; the fast path for the hot routes is part of the
HTTP protocol ``dq serve`` runs (``server/protocol.py``), outside this app. Invariant: one app owns one metrics registry and
(at most) one open engine; apps never share state, so tests can build many.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from dq.server.auth import TokenGate
from dq.server.batch_limit import BatchLimit
from dq.server.dependencies import require_token
from dq.server.errors import install_error_handlers
from dq.server.history import History
from dq.server.hot_routes import FastPathSlot
from dq.server.lifespan import make_lifespan
from dq.server.limits import BodyLimit
from dq.server.metrics import Metrics
from dq.server.path_guard import EncodedSlashGuard
from dq.server.replication import routes as replication
from dq.server.replication.metrics import ReplicationCollector
from dq.server.routers import (
    consumers,
    dashboard,
    items,
    keys,
    operate,
    ops,
    queues,
    schedules,
)
from dq.server.routers._common import ERRORS
from dq.server.schedule_metrics import ScheduleCollector
from dq.server.settings import Settings
from dq.server.sqs import install as install_sqs
from dq.server.ui import install_pages

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["create_app", "drain"]

_DESCRIPTION = """\
A durable deadline queue. Producers enqueue items that become due at a deadline;
consumers dequeue due items under a lease, then release or requeue them. An item whose
lease runs out comes back. Delivery is at least once. Values travel as text with an
`encoding` (`utf-8` or `base64`); times are integers, ms since the epoch. Errors are
JSON `{"error": code, "message": text}`.
"""


def create_app(settings: Settings | None = None, engine: Engine | None = None) -> FastAPI:
    """Build the service. Without ``engine`` the lifespan opens (and closes) one."""
    settings = settings if settings is not None else Settings.from_env()
    app = FastAPI(
        title="Deadline Queue",
        version="1",
        description=_DESCRIPTION,
        lifespan=make_lifespan(settings, engine),
        # We publish Prometheus metrics ourselves; FastAPI's OpenTelemetry probe costs
        # ~0.2 ms a request even with no provider configured.
        telemetry={"tracing": False, "metrics": False, "logs": False},
        # /docs is served from package files (server/ui.py), never from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    # Innermost first: a name holding an escaped '/' never reaches a route;
    # an over-long batch is refused while its body is walked.
    app.add_middleware(EncodedSlashGuard)
    app.add_middleware(BatchLimit, limit=settings.max_batch)
    app.add_middleware(BodyLimit, limit=settings.body_limit)
    # Outermost: no body is read before the token is checked.
    app.add_middleware(TokenGate, tokens=settings.tokens, read_tokens=settings.read_tokens)
    app.state.settings = settings
    app.state.metrics = Metrics()
    app.state.metrics.registry.register(
        ReplicationCollector(lambda: getattr(app.state, "replicator", None))
    )
    app.state.metrics.registry.register(
        ScheduleCollector(lambda: getattr(app.state, "scheduler", None))
    )
    app.state.service = None
    # the fast path's HotRoutes while the lifespan runs (server/protocol.py reads it)
    app.state.fast_path = FastPathSlot()
    #: the one timer of every schedule (storage/scheduler.py), while the lifespan runs
    app.state.scheduler = None
    app.state.shm = None  # the shared-memory server, while the lifespan runs one
    # replication (server/replication/): the node's role machine when DQ_ETCD is set,
    # and this node's Replicator while it leads
    app.state.node = None
    app.state.replicator = None
    app.state.history = History(
        settings.history_interval_ms / 1000.0,
        settings.history_retention_s,
        settings.history_max_queues,
    )
    install_error_handlers(app)
    guarded = [Depends(require_token)] if settings.tokens or settings.read_tokens else []
    # Routes are matched in order: the hot item routes first.
    app.include_router(items.router, dependencies=guarded)
    app.include_router(queues.router, dependencies=guarded)
    app.include_router(operate.router, dependencies=guarded)
    app.include_router(keys.router, dependencies=guarded)
    app.include_router(schedules.router, dependencies=guarded)
    app.include_router(schedules.every_queue, dependencies=guarded)
    app.include_router(ops.router)
    app.include_router(consumers.router, dependencies=guarded, responses=ERRORS)
    app.include_router(dashboard.router, dependencies=guarded)
    app.include_router(replication.router, dependencies=guarded)
    install_pages(app)
    # SQS at POST / (its own SigV4 auth with the same tokens): docs/sqs.md
    install_sqs(app)
    return app


def drain(app: FastAPI) -> None:
    """Shutdown has begun: end every long-poll now (thread- and signal-safe)."""
    service = getattr(app.state, "service", None)
    if service is not None:
        service.longpoll.drain()
