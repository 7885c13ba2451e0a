"""Client side of the named-consumer (delivery log) protocol and of keyed enqueue.

``ConsumerClient`` speaks ``/v1/queues/{queue}/consumers/{consumer}/...`` and
``KeyedEnqueuer`` speaks ``/v1/queues/{queue}/batches``; ``docs/spark.md`` specifies
both. Every call of the protocol is safe to repeat (pull tops up, read re-reads, commit
and ack are idempotent, a keyed batch runs once), so both classes retry transport
errors and 503s a few times with backoff. Errors are the client's own tree
(``dq.client.errors``): ``TransportError`` or a ``ServerError`` subclass with the server's code. Objects hold an ``httpx.Client``: create
them where they are used (in a Spark task, inside ``read``/``write``), never pickle them.
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from dq.client.errors import ServerError, TransportError, error_for

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

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({502, 503, 504})


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


class _Http:
    """A small retrying JSON caller shared by the two clients."""

    def __init__(self, url: str, token: str | None, timeout: float, retries: int) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout)
        self._retries = retries

    def close(self) -> None:
        self._http.close()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        delay = 0.2
        for attempt in range(self._retries + 1):
            try:
                r = self._http.request(method, path, json=body)
            except httpx.TransportError as exc:
                if attempt == self._retries:
                    raise TransportError(f"{method} {path}: {exc}") from exc
                log.warning("%s %s failed, retrying in %.1fs", method, path, delay)
            else:
                if r.status_code not in _RETRY_STATUS or attempt == self._retries:
                    return self._result(r)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    @staticmethod
    def _result(r: httpx.Response) -> Any:
        if r.status_code == 204:
            return None
        if r.is_success:
            return r.json()
        try:
            err = r.json()
            code, message = str(err.get("error")), str(err.get("message"))
        except ValueError:
            code, message = "http_error", r.text[:200]
        raise error_for(r.status_code, code, message)


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
        self._http = _Http(url, token, timeout, retries)
        self._base = f"/v1/queues/{queue}/consumers/{consumer}"

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
        return PullRange(**self._http.call("POST", self._base + "/pull", body))

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
        self._http = _Http(url, token, timeout, retries)
        self._path = f"/v1/queues/{queue}/batches"

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
