"""Every client operation as one ``Call``: what it asks of the HTTP API, how its answer decodes.

``Client`` and ``AsyncClient`` build one call per operation and hand it to their
transport's one method, ``call`` (as httpx hands a request to a transport's
``handle_request``). The HTTP transport (``client/_http.py``) sends the call's ``method``,
``path``, ``params`` and ``json()`` and returns ``decode(answer)``. The shared-memory
transport (``client/shm_transport.py``) serves the calls its command ring carries —
``EnqueueOne``, ``EnqueueMany``, ``Dequeue``, ``ReleaseOne``, ``ReleaseMany``,
``RequeueMany``, ``ExtendMany``, ``GetQueue``, ``Health`` — reading their arguments, and
hands every other call to its HTTP transport whole. So each operation is written once,
here, whichever transport carries it.

Invariants:
  - building a call sends nothing; it refuses only what its path cannot carry (a queue
    name the server would take for another path, ``queue_path``) and a value that is
    neither bytes nor text, before anything is sent, whichever the transport;
  - a call's body is made by ``json()`` when it is sent over HTTP, never for the ring:
    the calls the ring carries keep their arguments and build no JSON;
  - ``idempotent`` says whether the HTTP transport may send the call again after its
    answer was lost (``client/_http.py`` lists which are);
  - ``decode`` gives what the ``Client`` method returns, or raises the error it raises.

A call's class-level ``method``, ``wait_ms`` and ``params`` are its kind's; a call
that varies them (a long-poll's wait, a query string) holds its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from operator import attrgetter
from typing import Any, Generic, Self, TypeVar
from urllib.parse import quote

from dq.client import _wire
from dq.client._common import as_new_item, check_outcome
from dq.client.errors import BadRequest
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    Fail,
    GroupInfo,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
    Release,
    Requeue,
)

__all__ = [
    "Backup",
    "Browse",
    "Call",
    "CancelKey",
    "DeleteItem",
    "DeleteQueue",
    "Dequeue",
    "EnqueueMany",
    "EnqueueOne",
    "ExtendMany",
    "FailMany",
    "GetQueue",
    "Groups",
    "Health",
    "ItemBatch",
    "ListQueues",
    "PatchKey",
    "Pause",
    "Peek",
    "PeekKey",
    "Purge",
    "PutQueue",
    "Redrive",
    "ReleaseMany",
    "ReleaseOne",
    "Request",
    "RequeueMany",
    "queue_path",
]

R = TypeVar("R")
T = TypeVar("T")


@lru_cache(maxsize=4096)
def queue_path(queue: str) -> str:
    """The queue's path, or ``BadRequest`` (``invalid_queue_name``, as the server would
    answer) for a name a path cannot carry intact: the server decodes ``%2F`` before it
    routes, so ``a/items`` would name queue ``a``'s items (deleting that "queue" would
    purge ``a``), and an empty name is the queue list's address. Nothing is sent."""
    if not queue or "/" in queue:
        raise BadRequest(
            400,
            "invalid_queue_name",
            f"queue names match [A-Za-z0-9._-]{{1,128}} and do not start with '.' "
            f"(queue={queue!r})",
            queue=queue,
        )
    return "/v1/queues/" + quote(queue, safe="")


def _under(suffix: str) -> Callable[[str], str]:
    """``queue_path(queue) + suffix``, remembered per queue: the calls made for every
    item build no new path string."""

    @lru_cache(maxsize=4096)
    def path(queue: str) -> str:
        return queue_path(queue) + suffix

    return path


_items_path = _under("/items")
_dequeue_path = _under("/dequeue")
_release_path = _under("/release")
_requeue_path = _under("/requeue")
_extend_path = _under("/extend")
_fail_path = _under("/fail")


_key = attrgetter("key")


class Call(Generic[R]):
    """One call of the HTTP API: ``method`` ``path`` (``?params``) with body ``json()``,
    whose answer ``decode`` turns into the result. ``wait_ms``: how much longer than
    the transport's timeout its answer may take (a long-poll's wait)."""

    __slots__ = ("idempotent", "path", "queue")

    method: str = "GET"
    wait_ms: int = 0
    params: dict[str, Any] | None = None

    idempotent: bool
    path: str
    #: the queue the call acts on (errors name it), ``None`` for the others
    queue: str | None

    def json(self) -> Any:
        """The body: a JSON value, ``bytes`` that already are its compact JSON text, or
        ``None`` for none."""
        return None

    def decode(self, doc: Any) -> R:
        """The result from the decoded JSON answer (``None`` for a 204)."""
        result: R = doc
        return result

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.method} {self.path}>"


class Request(Call[Any]):
    """A call given as it goes: method, path, body; its answer's JSON as it came (the
    consumer-group client's calls, ``client/groups.py``)."""

    __slots__ = ("body", "method")

    def __init__(
        self, method: str, path: str, body: Any = None, *, idempotent: bool = False
    ) -> None:
        self.method = method
        self.path = path
        self.body = body
        self.idempotent = idempotent
        self.queue = None

    def json(self) -> Any:
        return self.body


# ---- the calls the command ring carries too -----------------------------------------


class EnqueueOne(Call[int]):
    """``Client.enqueue``: one item straight from the method's arguments (no ``NewItem``
    in between); the new item's id. Idempotent with a key (a repeat answers the first
    item and writes nothing)."""

    __slots__ = ("deadline", "delay_ms", "key", "value")

    method = "POST"
    queue: str

    def __init__(
        self,
        queue: str,
        value: bytes | str,
        deadline: int | None,
        delay_ms: int | None,
        key: str | None,
    ) -> None:
        if type(value) is not bytes:
            value = value.encode("utf-8") if type(value) is str else as_new_item(value).value
        self.path = _items_path(queue)
        self.queue = queue
        self.idempotent = key is not None
        self.value: bytes = value
        self.deadline = deadline
        self.delay_ms = delay_ms
        self.key = key

    def item(self) -> NewItem:
        return NewItem(self.value, self.deadline, self.delay_ms, self.key)

    def json(self) -> Any:
        body = _wire.enqueue_one_json(self.value, self.deadline, self.delay_ms, self.key)
        return body if body is not None else _wire.enqueue_body([self.item()])

    def decode(self, doc: Any) -> int:
        item_id: int = doc["items"][0]["id"]
        return item_id


class EnqueueMany(Call[list[Enqueued]]):
    """``enqueue_many``'s request (one of them, for a long list: ``client/_batches.py``).
    Idempotent when every item carries a key."""

    __slots__ = ("items",)

    method = "POST"
    queue: str

    def __init__(self, queue: str, items: Sequence[NewItem]) -> None:
        self.path = _items_path(queue)
        self.queue = queue
        self.idempotent = bool(items) and None not in map(_key, items)  # no Python frame
        self.items = items

    def json(self) -> Any:
        body = _wire.enqueue_json(self.items)
        return body if body is not None else _wire.enqueue_body(self.items)

    def decode(self, doc: Any) -> list[Enqueued]:
        return _wire.parse_enqueued(doc)


class Dequeue(Call[Dequeued]):
    """Lease up to ``count`` items, long-polling up to ``wait_ms``; the releases in
    ``release`` go first, and their outcomes come back in ``Dequeued.released``."""

    __slots__ = ("count", "lease_ms", "release", "wait_ms")

    method = "POST"
    queue: str

    def __init__(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
    ) -> None:
        self.path = _dequeue_path(queue)
        self.queue = queue
        self.idempotent = False
        self.count = count
        self.lease_ms = lease_ms
        self.wait_ms = wait_ms
        self.release = release

    def json(self) -> Any:
        body = _wire.dequeue_json(self.count, self.wait_ms, self.lease_ms, self.release)
        if body is None:
            return _wire.dequeue_body(self.count, self.wait_ms, self.lease_ms, self.release)
        return body

    def decode(self, doc: Any) -> Dequeued:
        return _wire.parse_dequeued(doc)


class ReleaseOne(Call[None]):
    """``Client.release``: ``None`` once released, else the item's error raised
    (``StaleReceipt`` ...)."""

    __slots__ = ("id", "receipt")

    method = "POST"
    queue: str

    def __init__(self, queue: str, item_id: int, receipt: str) -> None:
        self.path = _release_path(queue)
        self.queue = queue
        self.idempotent = False
        self.id = item_id
        self.receipt = receipt

    def json(self) -> Any:
        body = _wire.release_one_json(self.id, self.receipt)
        return body if body is not None else _wire.release_body([Release(self.id, self.receipt)])

    def decode(self, doc: Any) -> None:
        failed = _wire.failed_outcome(doc)
        if failed is not None:
            check_outcome(failed, self.queue)


class ItemBatch(Call[list[Outcome]], Generic[T]):
    """A release, requeue, fail or extend of several items: one ``Outcome`` per item, in
    order."""

    __slots__ = ("batch",)

    method = "POST"
    queue: str
    batch: Sequence[T]

    def __init__(self, queue: str, batch: Sequence[T]) -> None:
        self.path = self._path(queue)
        self.queue = queue
        self.idempotent = False
        self.batch = batch

    #: the path of the queue's batch, by queue (``_under``)
    _path: Callable[[str], str]

    def part(self, batch: Sequence[T]) -> Self:
        """The same call for ``batch``, part of the items (the shared-memory transport
        sends so the items a follower's ring refused)."""
        return type(self)(self.queue, batch)

    def decode(self, doc: Any) -> list[Outcome]:
        return _wire.parse_outcomes(doc)


class ReleaseMany(ItemBatch[Release]):
    __slots__ = ()

    _path = staticmethod(_release_path)

    def json(self) -> Any:
        body = _wire.release_json(self.batch)
        return body if body is not None else _wire.release_body(self.batch)


class RequeueMany(ItemBatch[Requeue]):
    __slots__ = ()

    _path = staticmethod(_requeue_path)

    def json(self) -> Any:
        return _wire.requeue_body(self.batch)


class FailMany(ItemBatch[Fail]):
    """Items that failed: back under the queue's retry policy, each keeping its error;
    the outcomes carry the next deadlines."""

    __slots__ = ()

    _path = staticmethod(_fail_path)

    def json(self) -> Any:
        return _wire.fail_body(self.batch)


class ExtendMany(ItemBatch[Extend]):
    __slots__ = ()

    _path = staticmethod(_extend_path)

    def json(self) -> Any:
        return _wire.extend_body(self.batch)


class GetQueue(Call[QueueInfo]):
    """One queue's config and stats."""

    __slots__ = ()

    queue: str

    def __init__(self, queue: str) -> None:
        self.path = queue_path(queue)
        self.queue = queue
        self.idempotent = True

    def decode(self, doc: Any) -> QueueInfo:
        return _wire.parse_queue(doc)


class Groups(Call[list[GroupInfo]]):
    """A queue's busiest groups: the most leased and held items (``docs/delivery.md``)."""

    __slots__ = ("params",)

    def __init__(self, queue: str, limit: int) -> None:
        self.path = queue_path(queue) + "/groups"
        self.queue = queue
        self.idempotent = True
        self.params = {"limit": limit}

    def decode(self, doc: Any) -> list[GroupInfo]:
        return _wire.parse_groups(doc)


class Health(Call[dict[str, Any]]):
    """Whether the server answers (over the ring: whether the ring does)."""

    __slots__ = ()

    def __init__(self) -> None:
        self.path = "/healthz"
        self.queue = None
        self.idempotent = True


# ---- the calls only HTTP carries ------------------------------------------------------


class ListQueues(Call[list[QueueInfo]]):
    __slots__ = ()

    def __init__(self) -> None:
        self.path = "/v1/queues"
        self.queue = None
        self.idempotent = True

    def decode(self, doc: Any) -> list[QueueInfo]:
        return [_wire.parse_queue(q) for q in doc["queues"]]


class PutQueue(Call[QueueInfo]):
    """Create the queue, or set its config (the same config again changes nothing)."""

    __slots__ = ("config",)

    method = "PUT"

    def __init__(self, queue: str, config: QueueConfig) -> None:
        self.path = queue_path(queue)
        self.queue = queue
        self.idempotent = True
        self.config = config

    def json(self) -> Any:
        return _wire.config_body(self.config)

    def decode(self, doc: Any) -> QueueInfo:
        return _wire.parse_queue(doc)


class DeleteQueue(Call[None]):
    """Delete the queue and its items; ``force``: even one other queues send their dead
    letters to (else refused, 409 ``dead_letter_queue_in_use``)."""

    __slots__ = ("params",)

    method = "DELETE"

    def __init__(self, queue: str, force: bool = False) -> None:
        self.path = queue_path(queue)
        self.queue = queue
        self.idempotent = False
        self.params = {"force": "true"} if force else None


class Pause(Call[QueueInfo]):
    """Pause the queue, or resume it (``resume``); either is idempotent."""

    __slots__ = ()

    method = "POST"

    def __init__(self, queue: str, resume: bool = False) -> None:
        self.path = queue_path(queue) + ("/resume" if resume else "/pause")
        self.queue = queue
        self.idempotent = True

    def decode(self, doc: Any) -> QueueInfo:
        return _wire.parse_queue(doc)


class Browse(Call[BrowsePage]):
    """One page of items in (deadline, id) order, without leasing them."""

    __slots__ = ("params",)

    def __init__(self, queue: str, state: str, after: str | None, limit: int, values: bool) -> None:
        params: dict[str, Any] = {"state": state, "limit": limit}
        if after is not None:
            params["after"] = after
        if values:
            params["values"] = "true"
        self.path = _items_path(queue)
        self.queue = queue
        self.idempotent = True
        self.params = params

    def decode(self, doc: Any) -> BrowsePage:
        return _wire.parse_page(doc)


class Peek(Call[BrowsedItem]):
    """Item ``item_id`` wherever it is (state "gone" once it left the queue)."""

    __slots__ = ("params",)

    def __init__(self, queue: str, item_id: int, values: bool) -> None:
        self.path = f"{queue_path(queue)}/items/{int(item_id)}"
        self.queue = queue
        self.idempotent = True
        self.params = {"values": "true" if values else "false"}

    def decode(self, doc: Any) -> BrowsedItem:
        return _wire.parse_browsed(doc)


def _key_path(queue: str, key: str) -> str:
    """The path of the item ``key`` names: the key escaped (a ``/`` in it as ``%2F``)."""
    return f"{queue_path(queue)}/keys/{quote(key, safe='')}"


class PeekKey(Call[BrowsedItem]):
    """The item ``key`` names, wherever it is (state "gone" once it left the queue)."""

    __slots__ = ("params",)

    def __init__(self, queue: str, key: str, values: bool) -> None:
        self.path = _key_path(queue, key)
        self.queue = queue
        self.idempotent = True
        self.params = {"values": "true" if values else "false"}

    def decode(self, doc: Any) -> BrowsedItem:
        return _wire.parse_browsed(doc)


class CancelKey(Call[int]):
    """Cancel the pending item ``key`` names; its id."""

    __slots__ = ()

    method = "DELETE"

    def __init__(self, queue: str, key: str) -> None:
        self.path = _key_path(queue, key)
        self.queue = queue
        self.idempotent = False

    def decode(self, doc: Any) -> int:
        return int(doc["cancelled"])


class PatchKey(Call[Enqueued]):
    """Give the pending item ``key`` names a new deadline and/or value; its id and
    the deadline it now has."""

    __slots__ = ("body",)

    method = "PATCH"

    def __init__(
        self,
        queue: str,
        key: str,
        deadline: int | None,
        delay_ms: int | None,
        value: bytes | str | None,
    ) -> None:
        body: dict[str, Any] = {}
        if deadline is not None:
            body["deadline"] = deadline
        if delay_ms is not None:
            body["delay_ms"] = delay_ms
        if value is not None:
            data = value.encode("utf-8") if isinstance(value, str) else as_new_item(value).value
            body.update(_wire.value_json(data))
        self.path = _key_path(queue, key)
        self.queue = queue
        self.idempotent = False
        self.body = body

    def json(self) -> Any:
        return self.body

    def decode(self, doc: Any) -> Enqueued:
        return Enqueued(int(doc["id"]), int(doc["deadline"]))


class Purge(Call[int]):
    """Remove every item of the queue; how many there were."""

    __slots__ = ()

    method = "DELETE"

    def __init__(self, queue: str) -> None:
        self.path = _items_path(queue)
        self.queue = queue
        self.idempotent = False

    def decode(self, doc: Any) -> int:
        return int(doc["purged"])


class DeleteItem(Call[None]):
    """Remove one item without a receipt."""

    __slots__ = ()

    method = "DELETE"

    def __init__(self, queue: str, item_id: int) -> None:
        self.path = f"{queue_path(queue)}/items/{int(item_id)}"
        self.queue = queue
        self.idempotent = False


class Redrive(Call[RedriveResult]):
    """Move items of a dead-letter queue back where they died, or to ``to``."""

    __slots__ = ("body",)

    method = "POST"

    def __init__(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> None:
        body: dict[str, Any] = {}
        if to is not None:
            body["to"] = to
        if ids is not None:
            body["ids"] = list(ids)
        if limit is not None:
            body["limit"] = limit
        self.path = queue_path(queue) + "/redrive"
        self.queue = queue
        self.idempotent = False
        self.body = body

    def json(self) -> Any:
        return self.body

    def decode(self, doc: Any) -> RedriveResult:
        return _wire.parse_redrive(doc)


class Backup(Call[BackupResult]):
    """A consistent copy of the server's data directory at ``dest``."""

    __slots__ = ("dest",)

    method = "POST"

    def __init__(self, dest: str) -> None:
        self.path = "/v1/backup"
        self.queue = None
        self.idempotent = False
        self.dest = dest

    def json(self) -> Any:
        return {"dest": self.dest}

    def decode(self, doc: Any) -> BackupResult:
        return _wire.parse_backup(doc)
