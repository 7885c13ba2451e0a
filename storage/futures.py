"""Resolving callers' futures: one sync answers many callers, and any of them may have
given up (cancelled its future) meanwhile."""

from __future__ import annotations

from concurrent.futures import Future, InvalidStateError
from typing import Any

__all__ = ["settle"]


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
