"""A compiled ring session (``dq.shm._session``) over an anonymous mapping, in-process, with
a handler that records what the session decoded and answers what the test says.

The engine is not involved: what a test sees is exactly the compiled loop's decoding of
the slots a client wrote and its encoding of the answers the handler gave.
"""

from __future__ import annotations

import mmap
import threading
from collections import deque
from concurrent.futures import Future
from typing import Any

from dq.shm._session import RingSession
from dq.shm.command_handler import STATUSES, _error
from dq.shm.command_ring import ClientRing, ring_size
from dq.storage.types import Enqueued, ItemOutcome, check_queue_name
from dq.storage.waits import Leased
from dq.storage.write_future import resolved

WAIT_S = 10.0

Call = tuple[Any, ...]


class Recorder:
    """A session handler: records each call (name, then its arguments) and answers the
    next of ``answers`` (a value, a future, or an exception to raise), else a default."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.answers: deque[Any] = deque()
        self.errors: list[BaseException] = []

    def _next(self, call: Call, default: Any) -> Any:
        self.calls.append(call)
        answer = self.answers.popleft() if self.answers else default
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def _durable(self, call: Call, default: Any) -> Future[Any]:
        answer = self._next(call, default)
        return answer if isinstance(answer, Future) else resolved(answer)

    def enqueue_one(self, value: bytes, deadline: int | None, delay: int | None) -> Future[Any]:
        return self._durable(("enqueue_one", value, deadline, delay), [Enqueued(1, 2)])

    def enqueue(self, items: list[Any]) -> Future[Any]:
        return self._durable(("enqueue", items), [Enqueued(1, 2)] * len(items))  # as one by one

    def release_one(self, item_id: int, receipt: str) -> Future[Any]:
        return self._durable(("release_one", item_id, receipt), [ItemOutcome(item_id)])

    def release(self, items: list[Any]) -> Future[Any]:
        return self._durable(("release", items), [ItemOutcome(i) for i, _ in items])

    def requeue(
        self, item_id: int, receipt: str, deadline: int | None, delay: int | None
    ) -> Future[Any]:
        call = ("requeue", item_id, receipt, deadline, delay)
        return self._durable(call, [ItemOutcome(item_id, deadline=5)])

    def put_many(self, items: list[Any], replace: bool = False) -> Future[Any]:
        call = ("put_many", items, True) if replace else ("put_many", items)
        return self._durable(call, [Enqueued(i + 1, 2) for i in range(len(items))])

    def delete_many(self, items: list[Any]) -> Future[Any]:
        return self._durable(("delete_many", items), [ItemOutcome(i) for i, _ in items])

    def extend(self, item_id: int, receipt: str, lease_ms: int) -> Any:
        default = [ItemOutcome(item_id, receipt="r.x", lease_expires=7)]
        return self._next(("extend", item_id, receipt, lease_ms), default)

    def find(self, count: int, wait_ms: int, lease_ms: int | None) -> Any:
        return self._next(("find", count, wait_ms, lease_ms), Leased())

    def stats(self) -> Any:
        return self._next(("stats",), b"{}")

    def bind(self, name: bytes) -> None:
        self._next(("bind", name), None)
        check_queue_name(name.decode("ascii", "replace"))

    def error(self, exc: BaseException) -> tuple[int, bytes]:
        self.errors.append(exc)
        return _error(exc)


class Served:
    """A ring, its compiled session (served by a thread once ``start``ed) and a client."""

    def __init__(
        self, capacity: int = 4, *, bound: bool = True, handler: Any = None, groups: bool = False
    ) -> None:
        self.mm = mmap.mmap(-1, ring_size(capacity))
        self.handler = Recorder()
        #: the handler the session calls (``handler``, or the recorder)
        self.served_by = self.handler if handler is None else handler
        #: ``groups``: the ring of a client that asked for its deliveries' groups
        self.session = RingSession(
            self.mm, capacity, self.served_by, STATUSES, bound=bound, groups=groups
        )
        self.client = ClientRing(self.mm, spin_us=0.0)
        self.failure: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> Served:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            self.session.serve(True, 0.0)
        except BaseException as exc:  # the test reads it
            self.failure = exc

    def join(self) -> None:
        """Wait for ``serve`` to end by itself (it raised: the client would be dropped)."""
        assert self._thread is not None
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the session did not end"

    def close(self) -> None:
        self.session.stop()
        if self._thread is not None:
            self._thread.join(WAIT_S)
            assert not self._thread.is_alive(), "the session did not stop"
        self.session.close()
        self.client.close()
        self.mm.close()

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
