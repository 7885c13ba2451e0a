"""Refuse a path whose segment carries an escaped ``/`` before any route sees it.

ASGI servers decode ``%2F`` into ``/`` before routing (``scope["path"]``), so a name
that holds a slash would be matched as more path: ``DELETE /v1/queues/q%2Fitems``,
meant for a queue named ``q/items``, would purge queue ``q``. No name, id or receipt
of the API may contain ``/`` (docs/http.md), so such a path is refused instead, by
the raw path the client sent: 400 ``invalid_queue_name`` when the escaped slash is in
the queue's segment, 404 ``not_found`` anywhere else. The one exception is an item's
key, the rest of ``/v1/queues/{queue}/keys/{key}``: a key may hold ``/``, and its route
takes every segment after ``keys/`` as the key, so there an escaped slash is the key's.
Invariant: nothing is routed, read or written for such a request. The fast path never takes a path with ``%``
(``server/protocol.py``), so this is the only place that decides.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from dq.server.errors import error_response

__all__ = ["EncodedSlashGuard"]

#: The raw path's segments before a queue's name: ``/v1/queues/{queue}``.
_QUEUE_SEGMENT = 3


class EncodedSlashGuard:
    """Pure ASGI middleware: a look at the raw path, nothing else per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # the path alone: a query may escape slashes (a browse cursor is base64)
            path = (scope.get("raw_path") or b"").split(b"?", 1)[0]
            if b"%2f" in path.lower() and not _in_key(path):
                await _refusal(path)(scope, receive, send)
                return
        await self.app(scope, receive, send)


#: The raw path's segments before an item's key: ``/v1/queues/{queue}/keys/{key}``.
_KEY_SEGMENT = 5


def _in_key(path: bytes) -> bool:
    """True when every escaped slash is in the key of a by-key route."""
    segments = path.split(b"/")
    if len(segments) <= _KEY_SEGMENT or segments[1:3] != [b"v1", b"queues"]:
        return False
    if segments[4] != b"keys":
        return False
    return not any(b"%2f" in s.lower() for s in segments[:_KEY_SEGMENT])


def _refusal(path: bytes) -> ASGIApp:
    segments = path.split(b"/")
    at = next(i for i, s in enumerate(segments) if b"%2f" in s.lower())
    if at == _QUEUE_SEGMENT and segments[1:3] == [b"v1", b"queues"]:
        return error_response(400, "invalid_queue_name", "a queue name cannot contain '/'")
    return error_response(404, "not_found", "no route: a path segment cannot contain '/'")
