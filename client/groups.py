"""Client side of the named-consumer (delivery log) protocol and of keyed enqueue.

``ConsumerClient`` speaks ``/v1/queues/{queue}/consumers/{consumer}/...`` and
``KeyedEnqueuer`` speaks ``/v1/queues/{queue}/batches``; ``docs/spark.md`` specifies
both. Every call of the protocol is safe to repeat (pull tops up, read re-reads, commit
and ack are idempotent, a keyed batch runs once), so both classes retry transport
errors and 502/503/504 a few times with backoff, through the client's one HTTP layer
(``client/_http.py``). Errors are the client's own tree (``dq.client.errors``):
``TransportError`` or a ``ServerError`` subclass with the server's code. Objects hold
connections: create them where they are used (in a Spark task, inside
``read``/``write``), never pickle them.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import quote

from dq.client._calls import Request, queue_path
from dq.client._http import HttpTransport
from dq.client._routing import RetryPolicy
from dq.client.errors import ServerError

__all__ = [
    "Acked",
    "ConsumerClient",
    "ConsumerInfo",
    "KeyedEnqueuer",
    "LoggedItem",
    "PullRange",
    "ReadColumns",
    "ReadResult",
]


@dataclass(frozen=True, slots=True)
class ConsumerInfo:
    queue: str
    consumer: str
    epoch: str
    next_seq: int
    first_unacked: int
    in_flight: int
    bytes: int
    lease_ms: int
    idle_timeout_ms: int
    lost: int
    queue_due: int | None = None  # answered by ``open`` only


@dataclass(frozen=True, slots=True)
class PullRange:
    """Read ``[start, end)``; ``pulled`` of those were leased by this call."""

    epoch: str
    start: int
    end: int
    pulled: int
    in_flight: int
    #: false when the queue does not exist (never created, or misspelled)
    queue_exists: bool = True


@dataclass(frozen=True, slots=True)
class LoggedItem:
    seq: int
    id: int
    receipt: str
    value: bytes
    deadline: int
    enqueue_time: int
    requeue_time: int
    dequeue_count: int
    lease_expires: int


@dataclass(frozen=True, slots=True)
class ReadResult:
    """``found`` is false when the server does not know the consumer (it restarted)."""

    found: bool
    epoch: str | None
    items: list[LoggedItem]


@dataclass(frozen=True, slots=True)
class ReadColumns:
    """A log range column by column; ``values`` holds every value back to back, cut by
    ``lengths``. ``found`` is false when the server does not know the consumer."""

    found: bool
    epoch: str | None
    seq: list[int]
    id: list[int]
    receipt: list[str]
    deadline: list[int]
    enqueue_time: list[int]
    requeue_time: list[int]
    dequeue_count: list[int]
    lease_expires: list[int]
    lengths: list[int]
    values: bytes


@dataclass(frozen=True, slots=True)
class Acked:
    released: int
    stale: int
    first_unacked: int
    next_seq: int


def _decode(raw: dict[str, Any]) -> LoggedItem:
    v = raw["value"]
    value = base64.b64decode(v) if raw["encoding"] == "base64" else v.encode("utf-8")
    st = raw["stats"]
    return LoggedItem(
        raw["seq"],
        raw["id"],
        raw["receipt"],
        value,
        raw["deadline"],
        st["enqueue_time"],
        st["requeue_time"],
        st["dequeue_count"],
        raw["lease_expires"],
    )


#: Every call of these protocols may be repeated, so all of them retry, 502/503/504 too.
_RETRY = RetryPolicy(retries=4, base_s=0.1, max_s=5.0, statuses=frozenset({502, 503, 504}))


class _Caller:
    """JSON calls through the client's one HTTP layer (``client/_http.py``)."""

    def __init__(self, url: str, token: str | None, timeout: float, retries: int) -> None:
        retry = dataclasses.replace(_RETRY, retries=retries)
        self._http = HttpTransport(url, token=token, timeout=timeout, retry=retry)

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self._http.call(Request(method, path, body, idempotent=True))


class ConsumerClient:
    """One named consumer of one queue."""

    def __init__(
        self,
        url: str,
        queue: str,
        consumer: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 4,
    ) -> None:
        self.queue = queue
        self.consumer = consumer
        self._http = _Caller(url, token, timeout, retries)
        self._base = f"{queue_path(queue)}/consumers/{quote(consumer, safe='')}"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ConsumerClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open(
        self, *, lease_ms: int | None = None, idle_timeout_ms: int | None = None
    ) -> ConsumerInfo:
        """Create the consumer if needed; return its state."""
        body = {"lease_ms": lease_ms, "idle_timeout_ms": idle_timeout_ms}
        return ConsumerInfo(**self._http.call("PUT", self._base, body))

    def info(self) -> ConsumerInfo | None:
        try:
            return ConsumerInfo(**self._http.call("GET", self._base))
        except ServerError as e:
            if e.code == "consumer_not_found":
                return None
            raise

    def pull(
        self,
        after: int,
        max_items: int,
        *,
        max_new: int | None = None,
        lease_ms: int | None = None,
    ) -> PullRange:
        """Top the log up so that ``[after, end)`` holds up to ``max_items`` entries."""
        body = {"after": after, "max_items": max_items, "max_new": max_new, "lease_ms": lease_ms}
        raw = self._http.call("POST", self._base + "/pull", body)
        return PullRange(
            raw["epoch"],
            raw["start"],
            raw["end"],
            raw["pulled"],
            raw["in_flight"],
            raw.get("queue_exists") is not False,
        )

    def read(self, start: int, end: int) -> ReadResult:
        raw = self._http.call("POST", self._base + "/read", {"start": start, "end": end})
        return ReadResult(raw["found"], raw["epoch"], [_decode(i) for i in raw["items"]])

    def read_columns(self, start: int, end: int) -> ReadColumns:
        """Like ``read``, column by column (what Spark executors use)."""
        body = {"start": start, "end": end, "layout": "columns"}
        raw = self._http.call("POST", self._base + "/read", body)
        cols = raw["columns"]
        values = base64.b64decode(cols.pop("values"))
        return ReadColumns(raw["found"], raw["epoch"], values=values, **cols)

    def commit(self, upto: int) -> Acked:
        return Acked(**self._http.call("POST", self._base + "/commit", {"upto": upto}))

    def ack(self, seqs: Sequence[int]) -> Acked:
        return Acked(**self._http.call("POST", self._base + "/ack", {"seqs": list(seqs)}))

    def requeue(
        self,
        seqs: Sequence[int] | None = None,
        *,
        deadline: int | None = None,
        delay_ms: int | None = None,
    ) -> Acked:
        body = {
            "seqs": None if seqs is None else list(seqs),
            "deadline": deadline,
            "delay_ms": delay_ms,
        }
        return Acked(**self._http.call("POST", self._base + "/requeue", body))

    def delete(self) -> bool:
        """Give back everything the consumer holds and forget it; False if it did not exist."""
        try:
            self._http.call("DELETE", self._base)
        except ServerError as e:
            if e.code == "consumer_not_found":
                return False
            raise
        return True


class KeyedEnqueuer:
    """Enqueue batches that run at most once per key (while the server remembers the key)."""

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        token: str | None = None,
        timeout: float = 60.0,
        retries: int = 4,
    ) -> None:
        self._http = _Caller(url, token, timeout, retries)
        self._path = f"{queue_path(queue)}/batches"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> KeyedEnqueuer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def enqueue(
        self, key: str, items: Sequence[tuple[bytes, int | None, int | None]]
    ) -> tuple[list[int], bool]:
        """Enqueue ``(value, deadline, delay_ms)`` items; returns (ids, replayed)."""
        body = {
            "key": key,
            "items": [
                {
                    "value": base64.b64encode(v).decode("ascii"),
                    "encoding": "base64",
                    "deadline": d,
                    "delay_ms": delay,
                }
                for v, d, delay in items
            ],
        }
        raw = self._http.call("POST", self._path, body)
        return [i["id"] for i in raw["items"]], bool(raw["replayed"])
