"""The SQS endpoint: ``POST /`` in the AWS JSON 1.0 protocol, dispatched to the actions.

A request names its action in ``X-Amz-Target: AmazonSQS.<Action>`` and carries its
parameters as a JSON object (``Content-Type: application/x-amz-json-1.0``); the answer
is a JSON object, or an error in the shape of ``server.sqs.errors``. Every answer has
an ``x-amzn-RequestId``. With ``DQ_TOKENS`` set, the request's Signature Version 4 is
verified first (``server.sqs.sigv4``). Queue URLs in answers use the host the client
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

from server.routers.items import disconnected
from server.sqs import admin, receive, send
from server.sqs.context import Ctx, Limits, SqsState
from server.sqs.errors import SqsError
from server.sqs.sigv4 import verify

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
    return Response(
        json.dumps(body),
        status_code=err.status,
        media_type=_CONTENT_TYPE,
        headers={
            "x-amzn-RequestId": request_id,
            "x-amzn-query-error": f"{err.code};{'Sender' if err.sender_fault else 'Receiver'}",
        },
    )


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
    settings = service.settings
    headers = request.headers
    sender, region = settings.sqs_account, _scope_region(headers.get("authorization"))
    if settings.tokens:
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


@router.post("/")
async def sqs_json(request: Request) -> Response:
    """Serve one SQS JSON-protocol request."""
    request_id = str(uuid.uuid4())
    try:
        target = request.headers.get("x-amz-target", "")
        if not target.startswith(_TARGET_PREFIX):
            raise SqsError(
                "InvalidAction",
                "dq serves the SQS JSON protocol at POST / "
                "(X-Amz-Target: AmazonSQS.<Action>); see docs/sqs.md.",
            )
        action = ACTIONS.get(target[len(_TARGET_PREFIX) :])
        if action is None:
            raise SqsError(
                "InvalidAction",
                f"The action {target[len(_TARGET_PREFIX) :]} is not valid for this endpoint.",
            )
        body = await request.body()
        ctx = _context(request, body)
        try:
            params = json.loads(body) if body.strip() else {}
        except ValueError:
            raise SqsError(
                "SerializationException", "The request body is not valid JSON."
            ) from None
        if not isinstance(params, dict):
            raise SqsError("SerializationException", "The request body must be a JSON object.")
        result = await action(ctx, params)
    except SqsError as err:
        return _error(err, request_id)
    except Exception:
        logger.exception("SQS %s failed", request.headers.get("x-amz-target"))
        return _error(
            SqsError("InternalFailure", "Internal error (see the server log)."), request_id
        )
    return Response(
        json.dumps(result, separators=(",", ":")),
        media_type=_CONTENT_TYPE,
        headers={"x-amzn-RequestId": request_id},
    )
