"""Operational routes: ``/healthz`` (liveness) and ``/metrics`` (Prometheus text).

``/healthz`` needs no bearer token (probes run without one); ``/metrics`` names the
queues, so with tokens set it needs one like the API. Invariant: ``/healthz`` is 200
only while the lifespan's engine is open, and costs O(1).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from dq.server.dependencies import require_token, service_of
from dq.server.routers._common import ERRORS, json_response
from dq.server.schemas import Health

__all__ = ["router"]

router = APIRouter(tags=["ops"])


@router.get(
    "/healthz",
    response_model=Health,
    responses={503: ERRORS[503]},
    summary="Liveness: 200 while the engine is open",
)
async def healthz(request: Request) -> Response:
    service = service_of(request)
    return json_response({"status": "ok", "queues": len(service.engine.list_queues())})


@router.get(
    "/metrics",
    dependencies=[Depends(require_token)],
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}},
    summary="Prometheus metrics",
)
async def metrics(request: Request) -> Response:
    body = request.app.state.metrics.render()
    return Response(body, media_type=CONTENT_TYPE_LATEST)
