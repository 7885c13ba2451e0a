"""Shared dependencies of the routers: the running service and bearer-token auth.

Owns ``Service`` — what the lifespan opened (engine, long-poll, metrics, settings,
durable completions, the consumer-group log and the keyed-batch memory) —,
the ``Groups`` and ``Batches`` dependencies of the consumer routes, and the ``require_token`` guard, which documents the bearer
scheme in OpenAPI (the ``TokenGate`` in front of the app has already refused a request
without a valid token before its body was read; both use ``dq.server.auth.token_ok``). Invariant: every dependency here is ``async def``,
so FastAPI never sends it to its thread pool (a sync dependency would cost a thread
hop on every request); hot routes reach the service through ``service_of(request)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dq.server.auth import READS, forbidden, role, unauthorized
from dq.server.consumer_groups import ConsumerGroups
from dq.server.errors import ApiError
from dq.server.keyed_batches import IdempotentBatches
from dq.server.schemas import QUEUE_NAME_REGEX
from dq.storage.syncer import InlineCommits

if TYPE_CHECKING:
    from dq.server.completions import Completions
    from dq.server.longpoll import LongPoll
    from dq.server.metrics import Metrics
    from dq.server.settings import Settings
    from dq.storage import Engine
    from dq.storage.itemops import ItemOps

__all__ = [
    "Batches",
    "Groups",
    "QueuePath",
    "Service",
    "consumer_groups",
    "keyed_batches",
    "require_token",
    "service_of",
]


@dataclass(slots=True)
class Service:
    """Everything a route needs, opened by the lifespan and stored on ``app.state``."""

    engine: Engine
    settings: Settings
    metrics: Metrics
    #: the item operations' rules and engine calls, shared with the ring
    ops: ItemOps
    longpoll: LongPoll
    completions: Completions
    groups: ConsumerGroups
    batches: IdempotentBatches
    #: passed (``inline=``) with an engine ``*_nowait`` write started on the loop: the
    #: loop commits it at its next turn (``storage/syncer.py``; None when off)
    inline: InlineCommits | None = None


def service_of(request: Request) -> Service:
    """The running service. Routes call this instead of declaring a dependency: a
    FastAPI dependency costs ~30 µs a request, a significant part of a small enqueue."""
    service: Service | None = request.app.state.service
    if service is None:
        raise ApiError(503, "unavailable", "the server is starting or stopping")
    return service


async def consumer_groups(request: Request) -> ConsumerGroups:
    """Every consumer's delivery log (``server/consumer_groups.py``). It lives in this
    node's memory, beside the engine: a follower refuses every consumer route with
    ``NotLeader`` (421), reads included, so that a client's log is always the leader's."""
    service = service_of(request)
    service.engine.check_writable()
    return service.groups


async def keyed_batches(request: Request) -> IdempotentBatches:
    """The keyed-batch memory (``server/keyed_batches.py``), on the leader only (as
    ``consumer_groups``)."""
    service = service_of(request)
    service.engine.check_writable()
    return service.batches


Groups = Annotated[ConsumerGroups, Depends(consumer_groups)]
Batches = Annotated[IdempotentBatches, Depends(keyed_batches)]

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
    """401 unless the request carries ``Authorization: Bearer <one of DQ_TOKENS>`` (or, for
    a read, one of ``DQ_READ_TOKENS``); 403 for a read-only token's write."""
    settings = request.app.state.settings
    if not (settings.tokens or settings.read_tokens):
        return
    header = None if credentials is None else f"Bearer {credentials.credentials}".encode()
    who = role(
        header,
        tuple(t.encode() for t in settings.tokens),
        tuple(t.encode() for t in settings.read_tokens),
    )
    if who == "read" and request.method not in READS:
        raise ApiError(*forbidden())
    if who is None:
        raise ApiError(*unauthorized())
