"""The client's one error tree; server errors map onto it by their stable ``error`` code.

ClientError
├── TransportError            could not talk to the server (connect, timeout)
├── UnsupportedAddress        a URL scheme no transport handles
└── ServerError               the server answered with an error (``status``, ``code``)
    ├── BadRequest            400 / 422 (``ValidationError``)
    │   └── ValidationError
    ├── Unauthorized          401
    ├── NotFound              404
    │   ├── QueueNotFound
    │   ├── ItemNotFound
    │   └── KeyNotFound       no item has that key within the queue's dedup window
    ├── Conflict              409
    │   ├── StaleReceipt      that delivery is over; nothing changed
    │   └── ItemLeased        a consumer has the item a key names; nothing changed
    ├── TooLarge              413
    ├── NotLeaderError        421 that could not be followed (``leader``: the last one named)
    ├── Unavailable           503 (retryable)
    └── StorageFull           507
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequest",
    "ClientError",
    "Conflict",
    "ItemLeased",
    "ItemNotFound",
    "KeyNotFound",
    "NotFound",
    "NotLeaderError",
    "QueueNotFound",
    "ServerError",
    "StaleReceipt",
    "StorageFull",
    "TooLarge",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedAddress",
    "ValidationError",
    "error_for",
]


class ClientError(Exception):
    """Base of every error the client raises.

    ``done``: a ``*_many`` call sends a list longer than one request takes as several
    requests (``client/_batches.py``); when one fails, its error carries the results of
    the requests before it, in order (``Enqueued`` for ``enqueue_many``, ``Outcome``
    otherwise): those items were carried out and stay so, and nothing after was sent.
    Empty for any other call, or when the first request failed."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)
        self.done: list[Any] = []


class TransportError(ClientError):
    """The request may not have reached the server (connection refused, timeout)."""


class UnsupportedAddress(ClientError):
    """No transport handles this address."""


class ServerError(ClientError):
    """The server refused the request; ``code`` is the server's stable error code."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        queue: str | None = None,
        id: int | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.queue = queue
        self.id = id


class BadRequest(ServerError):
    pass


class ValidationError(BadRequest):
    pass


class Unauthorized(ServerError):
    pass


class NotFound(ServerError):
    pass


class QueueNotFound(NotFound):
    pass


class ItemNotFound(NotFound):
    pass


class KeyNotFound(NotFound):
    pass


class Conflict(ServerError):
    pass


class ItemLeased(Conflict):
    pass


class StaleReceipt(Conflict):
    pass


class TooLarge(ServerError):
    pass


class NotLeaderError(ServerError):
    """A replicated deployment's follower answered and no leader could be reached by
    following its redirects (``docs/client.md``, "Several servers"). The request was
    not carried out: followers refuse before doing anything."""

    #: the leader the last follower named (``None``: it knew none)
    leader: str | None = None


class Unavailable(ServerError):
    pass


class StorageFull(ServerError):
    pass


_BY_CODE: dict[str, type[ServerError]] = {
    "validation_error": ValidationError,
    "queue_not_found": QueueNotFound,
    "item_not_found": ItemNotFound,
    "key_not_found": KeyNotFound,
    "item_leased": ItemLeased,
    "stale_receipt": StaleReceipt,
    "unauthorized": Unauthorized,
    "storage_full": StorageFull,
    "unavailable": Unavailable,
    "not_leader": NotLeaderError,
}
_BY_STATUS: dict[int, type[ServerError]] = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: TooLarge,
    421: NotLeaderError,
    422: ValidationError,
    503: Unavailable,
    507: StorageFull,
}
_STATUS_OF_CODE = {
    "stale_receipt": 409,
    "item_not_found": 404,
    "invalid_receipt": 400,
    "item_leased": 409,
    "key_not_found": 404,
}


def error_for(
    status: int | None, code: str, message: str, *, queue: str | None = None, id: int | None = None
) -> ServerError:
    """The most specific error class for a server ``code`` (or else its HTTP status)."""
    if status is None:
        status = _STATUS_OF_CODE.get(code, 400)
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, ServerError)
    return cls(status, code, message, queue=queue, id=id)
