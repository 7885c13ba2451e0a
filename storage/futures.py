"""Resolving callers' futures: one sync answers many callers, and any of them may have
given up (cancelled its future) meanwhile."""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from typing import Any

from dq.storage.errors import EngineUnavailable
from dq.storage.write_future import WriteFuture

__all__ = ["Answer", "after_all", "answer", "settle"]


def settle(fut: Future[Any], result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a caller's future unless the caller gave up on it (cancelled it).

    One sync resolves many futures; one cancelled future must not leave the others
    of its batch hanging.
    """
    if fut.done():
        return
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except InvalidStateError:  # cancelled between the check and the call
        pass


#: (future, result, error): settled outside the queue lock by ``answer``
Answer = tuple["Future[Any]", Any, BaseException | None]


def answer(answers: list[Answer]) -> None:
    """Settle each (future, result, error); call with no queue lock held (callbacks run).
    A write's own future (``WriteFuture``, nearly every one) settles in one call."""
    for fut, result, error in answers:
        if isinstance(fut, WriteFuture):
            fut.settle(result, error)
        else:
            settle(fut, result, error)


def after_all(futures: list[Future[Any]], answer: Any) -> Future[Any]:
    """A future resolving to ``answer`` once every future in ``futures`` has succeeded
    (or with the first failure)."""
    out: Future[Any] = Future()
    if not futures:
        out.set_result(answer)
        return out
    left = [len(futures)]
    lock = threading.Lock()

    def one(f: Future[Any]) -> None:
        error = f.exception() if not f.cancelled() else EngineUnavailable("write cancelled")
        with lock:
            left[0] -= 1
            last = left[0] == 0
        if error is not None:
            settle(out, error=error)
        elif last:
            settle(out, answer)

    for f in futures:
        f.add_done_callback(one)
    return out
