"""The SQS endpoint: ``POST /`` in the AWS JSON 1.0 protocol, dispatched to the actions.

A request names its action in ``X-Amz-Target: AmazonSQS.<Action>`` and carries its
parameters as a JSON object (``Content-Type: application/x-amz-json-1.0``); the answer
is a JSON object, or an error in the shape of ``dq.server.sqs.errors``. Older SDKs' query
protocol (a form with ``Action=``, at ``/`` or at the queue's URL) is translated by
``dq.server.sqs.query`` to the same actions. Every answer has
an ``x-amzn-RequestId``. With ``DQ_TOKENS`` set, the request's Signature Version 4 is
verified first (``dq.server.sqs.sigv4``). Queue URLs in answers use the host the client
addressed, so URLs work from wherever the client reaches the server.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

from fastapi import APIRouter, Request, Response

from dq.server.errors import LEADER_HEADER, allowed_methods, error_response
from dq.server.routers.items import disconnected
from dq.server.sqs import admin, receive, send
from dq.server.sqs.context import Ctx, Limits, SqsState
from dq.server.sqs.errors import SqsError, from_storage
from dq.server.sqs.query import error_xml, params_from_form, result_xml
from dq.server.sqs.sigv4 import verify
from dq.storage.errors import NotLeader

__all__ = ["ACTIONS", "router"]

logger = logging.getLogger(__name__)

Action = Callable[[Ctx, dict[str, Any]], Awaitable[dict[str, Any]]]

ACTIONS: dict[str, Action] = {
    **admin.ACTIONS,
    "SendMessage": send.send_message,
    "SendMessageBatch": send.send_message_batch,
    "ReceiveMessage": receive.receive_message,
    "DeleteMessage": receive.delete_message,
    "DeleteMessageBatch": receive.delete_message_batch,
    "ChangeMessageVisibility": receive.change_message_visibility,
    "ChangeMessageVisibilityBatch": receive.change_message_visibility_batch,
}

_CONTENT_TYPE = "application/x-amz-json-1.0"
_TARGET_PREFIX = "AmazonSQS."

router = APIRouter(include_in_schema=False)


def _error(err: SqsError, request_id: str) -> Response:
    body = {"__type": f"com.amazonaws.sqs#{err.shape}", "message": err.message}
    headers = {
        "x-amzn-RequestId": request_id,
        "x-amzn-query-error": f"{err.code};{'Sender' if err.sender_fault else 'Receiver'}",
    }
    if err.leader is not None:
        headers[LEADER_HEADER] = err.leader
    return Response(
        json.dumps(body), status_code=err.status, media_type=_CONTENT_TYPE, headers=headers
    )


def _error_xml(err: SqsError, request_id: str) -> Response:
    headers = {LEADER_HEADER: err.leader} if err.leader is not None else None
    return Response(error_xml(err, request_id), err.status, headers=headers, media_type="text/xml")


def _scope_region(authorization: str | None) -> str | None:
    """The region of an Authorization header's credential scope, checked or not."""
    if not authorization or "Credential=" not in authorization:
        return None
    parts = authorization.split("Credential=", 1)[1].split(",", 1)[0].split("/")
    return parts[2] if len(parts) == 5 else None


def _context(request: Request, body: bytes) -> Ctx:
    service = request.app.state.service
    if service is None:
        raise SqsError("ServiceUnavailable", "The server is starting or stopping.")
    try:  # a follower serves no SQS action: queue attributes and receives are the leader's
        service.engine.check_writable()
    except NotLeader as exc:
        raise from_storage(exc) from None
    settings = service.settings
    headers = request.headers
    sender, region = settings.sqs_account, _scope_region(headers.get("authorization"))
    if settings.tokens or settings.read_tokens:  # read-only tokens are no SQS secrets
        caller = verify(
            request.method,
            request.scope.get("raw_path", request.url.path.encode()).decode("latin-1"),
            request.scope.get("query_string", b""),
            request.scope["headers"],
            body,
            settings.tokens,
        )
        sender, region = caller.access_key, caller.region
    state: SqsState = request.app.state.sqs
    host = headers.get("host") or f"{settings.host}:{settings.port}"
    return Ctx(
        service=service,
        state=state,
        limits=Limits.of(settings),
        base=f"{request.url.scheme}://{host}",
        account=settings.sqs_account,
        region=region or settings.sqs_region,
        sender=sender,
        gone=partial(disconnected, request.receive),
    )


def _is_query(request: Request) -> bool:
    """A query-protocol request: form-encoded, or ``Action`` in the query string."""
    ctype = request.headers.get("content-type", "")
    return ctype.startswith("application/x-www-form-urlencoded") or b"Action=" in request.scope.get(
        "query_string", b""
    )


def _action(name: str) -> Action:
    action = ACTIONS.get(name)
    if action is None:
        raise SqsError("InvalidAction", f"The action {name} is not valid for this endpoint.")
    return action


async def _json_call(request: Request, target: str) -> dict[str, Any]:
    action = _action(target[len(_TARGET_PREFIX) :])
    body = await request.body()
    ctx = _context(request, body)
    try:
        params = json.loads(body) if body.strip() else {}
    except ValueError:
        raise SqsError("SerializationException", "The request body is not valid JSON.") from None
    if not isinstance(params, dict):
        raise SqsError("SerializationException", "The request body must be a JSON object.")
    return await action(ctx, params)


async def _serve(request: Request, queue_path: str | None) -> Response:
    request_id = str(uuid.uuid4())
    target = request.headers.get("x-amz-target", "")
    query = not target and _is_query(request)
    name = target
    try:
        if target.startswith(_TARGET_PREFIX):
            result = await _json_call(request, target)
        elif query:
            body = await request.body()
            ctx = _context(request, body)
            name, params = params_from_form(
                body, request.scope.get("query_string", b""), queue_path
            )
            result = await _action(name)(ctx, params)
        else:
            raise SqsError(
                "InvalidAction",
                "dq serves SQS at POST / (JSON protocol: X-Amz-Target: AmazonSQS.<Action>; "
                "query protocol: a form with Action=...); see docs/sqs.md.",
            )
    except SqsError as err:
        if query:
            return _error_xml(err, request_id)
        return _error(err, request_id)
    except Exception:
        logger.exception("SQS %s failed", name)
        failure = SqsError("InternalFailure", "Internal error (see the server log).")
        if query:
            return Response(error_xml(failure, request_id), failure.status, media_type="text/xml")
        return _error(failure, request_id)
    if query:
        return Response(
            result_xml(name, result, request_id),
            media_type="text/xml",
            headers={"x-amzn-RequestId": request_id},
        )
    return Response(
        json.dumps(result, separators=(",", ":")),
        media_type=_CONTENT_TYPE,
        headers={"x-amzn-RequestId": request_id},
    )


@router.post("/")
async def sqs_root(request: Request) -> Response:
    """Serve one SQS request (JSON or query protocol)."""
    return await _serve(request, None)


#: Every method, so that anything but a query-protocol POST is "not found", as it was
#: before this route existed (a POST-only route would answer 405 to a GET here).
_ANY = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


@router.api_route("/{account}/{queue}", methods=_ANY)
async def sqs_queue_path(account: str, queue: str, request: Request) -> Response:
    """A query-protocol request sent to a queue's URL; anything else here is not found,
    or, at a path of dq's own API (``PATCH /v1/queues``), a 405 naming its methods."""
    if request.method != "POST" or request.headers.get("x-amz-target") or not _is_query(request):
        allowed = allowed_methods(request)
        if allowed:
            allow = {"Allow": ", ".join(allowed)}
            return error_response(405, "method_not_allowed", "Method Not Allowed", allow)
        return error_response(404, "not_found", "Not Found")
    return await _serve(request, f"/{account}/{queue}")
