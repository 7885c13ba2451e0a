"""Shared dependencies of the routers: the running service and bearer-token auth.

Owns ``Service`` — what the lifespan opened (engine, long-poll, metrics, settings) —
and the ``require_token`` guard. Invariant: every dependency here is ``async def``,
so FastAPI never sends it to its thread pool (a sync dependency would cost a thread
hop on every request); hot routes reach the service through ``service_of(request)``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from server.errors import ApiError
from server.schemas import QUEUE_NAME_REGEX

if TYPE_CHECKING:
    from server.longpoll import LongPoll
    from server.metrics import Metrics
    from server.settings import Settings
    from storage import Engine

__all__ = ["QueuePath", "Service", "require_token", "service_of"]


@dataclass(slots=True)
class Service:
    """Everything a route needs, opened by the lifespan and stored on ``app.state``."""

    engine: Engine
    settings: Settings
    metrics: Metrics
    longpoll: LongPoll


def service_of(request: Request) -> Service:
    """The running service. Routes call this instead of declaring a dependency: a
    FastAPI dependency costs ~30 µs a request, a significant part of a small enqueue."""
    service: Service | None = request.app.state.service
    if service is None:
        raise ApiError(503, "unavailable", "the server is starting or stopping")
    return service


#: The pattern is documented but checked by the engine (``check_queue_name``: 400
#: ``invalid_queue_name``) rather than by FastAPI: a path regex costs ~7 us a request.
QueuePath = Annotated[
    str,
    Path(
        description="queue name",
        json_schema_extra={"pattern": QUEUE_NAME_REGEX, "maxLength": 128},
    ),
]

_bearer = HTTPBearer(auto_error=False, description="a token from DQ_TOKENS")


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the request carries ``Authorization: Bearer <one of DQ_TOKENS>``."""
    tokens: tuple[str, ...] = request.app.state.settings.tokens
    if not tokens:
        return
    if credentials is not None:
        given = credentials.credentials.encode()
        for token in tokens:
            if hmac.compare_digest(given, token.encode()):
                return
    raise ApiError(
        401, "unauthorized", "a valid bearer token is required", {"WWW-Authenticate": "Bearer"}
    )
