"""The one bearer-token check, used before a request's body is read.

``token_ok`` is what every path asks: the ASGI gate (``TokenGate``, outermost, so a
refused request never has its body read or parsed), the HTTP fast path, and the
FastAPI dependency that documents the scheme in OpenAPI. Invariant: with tokens set,
no ``/v1`` route and no ``/metrics`` scrape is served without one, and a read-only token
(``DQ_READ_TOKENS``) gets nothing but GET and HEAD; comparisons are constant-time.
"""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from dq.server.errors import error_response

__all__ = [
    "GUARDED",
    "READS",
    "TokenGate",
    "forbidden",
    "guarded",
    "role",
    "token_ok",
    "unauthorized",
]

#: What needs a bearer token when tokens are set: the API and the metrics (they name
#: the queues). Everything else holds no data (``/healthz``, the OpenAPI document and
#: the pages of ``server/ui.py``) or authenticates itself (the SQS endpoint at ``/``
#: checks a SigV4 signature made with the same tokens, which needs the body).
GUARDED = ("/v1/", "/metrics")
_MESSAGE = "a valid bearer token is required"
#: What a read-only token (``DQ_READ_TOKENS``) may do.
READS = ("GET", "HEAD")


def token_ok(header: bytes | None, tokens: tuple[bytes, ...]) -> bool:
    """``header`` is the raw ``Authorization`` value; true when it names one of ``tokens``."""
    if header is None:
        return False
    scheme, _, given = header.strip().partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    given = given.strip()
    ok = False
    for token in tokens:  # no early exit: the time does not tell which token matched
        ok |= hmac.compare_digest(given, token)
    return ok


def role(header: bytes | None, tokens: tuple[bytes, ...], reads: tuple[bytes, ...]) -> str | None:
    """``"admin"`` for a token of ``tokens``, ``"read"`` for one of ``reads``, else None."""
    if token_ok(header, tokens):
        return "admin"
    if reads and token_ok(header, reads):
        return "read"
    return None


def guarded(path: str) -> bool:
    return path.startswith(GUARDED) or path == "/v1"


def unauthorized() -> tuple[int, str, str, dict[str, str]]:
    return 401, "unauthorized", _MESSAGE, {"WWW-Authenticate": "Bearer"}


def forbidden() -> tuple[int, str, str, dict[str, str]]:
    return 403, "forbidden", "this token may only read (GET)", {}


class TokenGate:
    """Refuses (401) a request without a valid token before anything reads its body, and
    (403) a read-only token's request that is not a read."""

    def __init__(
        self, app: ASGIApp, tokens: tuple[str, ...], read_tokens: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.tokens = tuple(t.encode() for t in tokens)
        self.reads = tuple(t.encode() for t in read_tokens)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not (self.tokens or self.reads) or not guarded(scope["path"]):
            await self.app(scope, receive, send)
            return
        header = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                header = value
                break
        who = role(header, self.tokens, self.reads)
        if who == "admin" or (who == "read" and scope["method"] in READS):
            await self.app(scope, receive, send)
            return
        status, code, message, headers = forbidden() if who == "read" else unauthorized()
        await error_response(status, code, message, headers)(scope, receive, send)
