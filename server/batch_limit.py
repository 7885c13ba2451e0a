"""The batch limit, enforced while the body is parsed rather than after.

A batch route's body is ``{"items": [...]}`` (a dequeue's may carry ``"release": [...]``).
Validating a 2-million-item body with pydantic before counting it held the event loop
for seconds. ``over_batch`` walks the top-level object with the standard library's C
decoder one value at a time and stops at the first array element past the limit, so
refusing a huge batch costs at most ``limit + 1`` decoded elements. A body with fewer
commas than the limit cannot hold a longer array and is not walked at all (the common
case costs one ``bytes.count``). ``BatchLimit`` applies it, as a pure ASGI middleware,
to the FastAPI routes; the fast path (``server/hot_routes.py``) calls it directly.
Invariant: the refusal is 413 ``batch_too_large`` with the rule's words
(``storage/validation.py``, as the engine's own check says them) on both paths; a body
that is not a JSON object is left for the schema check to word.
"""

from __future__ import annotations

import json
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dq.server.errors import error_response
from dq.storage.validation import batch_too_large_message

__all__ = ["BATCH_KEYS", "BatchLimit", "over_batch"]

#: The arrays whose length the batch limit bounds.
BATCH_KEYS = frozenset({"items", "release"})
_ROUTES = re.compile(r"/v1/queues/[^/]+/(items|release|requeue|extend|dequeue)")
_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def over_batch(body: bytes, limit: int) -> bool:
    """True when an array under a batch key of the body's object holds > ``limit`` items."""
    if body.count(b",") < limit:
        return False
    try:
        return _walk(body.decode("utf-8"), limit)
    except (ValueError, IndexError):
        return False  # not JSON, or not shaped like a batch: validation says why


def _walk(s: str, limit: int) -> bool:
    decode = _decoder.raw_decode
    i = _WS.match(s, 0).end()  # type: ignore[union-attr]
    if s[i] != "{":
        return False
    i += 1
    while True:
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i] == "}":
            return False
        key, i = decode(s, i)
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i] != ":":
            return False
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]
        if key in BATCH_KEYS and s[i] == "[":
            over, i = _array(s, i + 1, limit)
            if over:
                return True
        else:
            _, i = decode(s, i)
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i] == ",":
            i += 1
        elif s[i] == "}":
            return False
        else:
            return False


def _array(s: str, i: int, limit: int) -> tuple[bool, int]:
    """(more than ``limit`` elements?, index after the array or where counting stopped)."""
    decode = _decoder.raw_decode
    i = _WS.match(s, i).end()  # type: ignore[union-attr]
    if s[i] == "]":
        return False, i + 1
    n = 0
    while True:
        _, i = decode(s, i)
        n += 1
        if n > limit:
            return True, i
        i = _WS.match(s, i).end()  # type: ignore[union-attr]
        if s[i] == "]":
            return False, i + 1
        if s[i] != ",":
            raise ValueError("not an array")
        i = _WS.match(s, i + 1).end()  # type: ignore[union-attr]


class BatchLimit:
    """Refuses an over-long batch (413) before the framework parses and validates it."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or _ROUTES.fullmatch(scope["path"]) is None
        ):
            await self.app(scope, receive, send)
            return
        chunks = []  # the body limit outside this middleware bounds what is held here
        while True:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message)
            if not message.get("more_body", False):
                break
        body = b"".join(m.get("body", b"") for m in chunks)
        if over_batch(body, self.limit):
            message_text = batch_too_large_message(self.limit)
            await error_response(413, "batch_too_large", message_text)(scope, receive, send)
            return
        whole: Message = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, _replay([whole], receive), send)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
