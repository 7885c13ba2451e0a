"""The future a durable write answers with: a ``concurrent.futures.Future`` that costs
a fraction of one.

Every write (enqueue, release, requeue) hands its caller a future that the syncer
thread resolves once the record is durable. The standard ``Future`` builds a
``threading.Condition`` (an ``RLock`` and several bound methods, ~4 µs here) when it
is made, and takes it on every ``done()``, ``result()`` and ``set_result()``; on the
server's hot path that was ~10 µs of every single-item write, mostly on the event loop.

``WriteFuture`` keeps the standard class's public behaviour (``result(timeout)``,
``exception``, ``add_done_callback``, ``cancel``; ``InvalidStateError`` when set twice
or after a cancel; callbacks run once, in order, by the thread that resolves it or at
once if it is already done) and is a subclass, so ``isinstance`` and
``asyncio.wrap_future`` accept it. What changes is the bookkeeping: state moves under
one module-wide lock held for a few bytecodes, reading a finished state takes no lock,
and a thread that must block gets its ``threading.Event`` only when it blocks. It does
not support ``concurrent.futures.wait`` / ``as_completed`` (they use the standard
class's private fields), which nothing here calls on a write's future.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import CancelledError, Future, InvalidStateError
from typing import Any, TypeVar

__all__ = ["WriteFuture", "resolved"]

log = logging.getLogger(__name__)

T = TypeVar("T")

_PENDING = 0
_FINISHED = 1
_CANCELLED = 2

#: Guards every ``WriteFuture``'s state change; held for a few bytecodes at a time.
_guard = threading.Lock()


class WriteFuture(Future[T]):
    """A ``concurrent.futures.Future`` without a ``Condition`` of its own.

    A new future's state is the class's defaults (pending, no value, no waiters): every
    write makes one, and ``object.__init__`` (the base's would build the Condition) is a
    C call where an ``__init__`` of our own was a Python one."""

    _phase: int = _PENDING
    _value: Any = None
    _error: BaseException | None = None
    _callbacks: list[Callable[[Future[T]], object]] | None = None
    _event: threading.Event | None = None

    __init__ = object.__init__

    def __repr__(self) -> str:
        state = ("pending", "finished", "cancelled")[self._phase]
        if self._phase == _FINISHED:
            if self._error is not None:
                return f"<WriteFuture at {id(self):#x} state=finished raised {type(self._error).__name__}>"
            return f"<WriteFuture at {id(self):#x} state=finished returned {type(self._value).__name__}>"
        return f"<WriteFuture at {id(self):#x} state={state}>"

    # ------------------------------------------------------------------ reading

    def done(self) -> bool:
        return self._phase != _PENDING

    def cancelled(self) -> bool:
        return self._phase == _CANCELLED

    def running(self) -> bool:
        return False  # a write's future is never marked running

    def result(self, timeout: float | None = None) -> T:
        if self._phase == _PENDING:
            self._wait(timeout)
        if self._phase == _CANCELLED:
            raise CancelledError()
        error = self._error
        if error is not None:
            try:
                raise error
            finally:
                del error  # no cycle through the traceback's frame
        value: T = self._value
        return value

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._phase == _PENDING:
            self._wait(timeout)
        if self._phase == _CANCELLED:
            raise CancelledError()
        return self._error

    def _wait(self, timeout: float | None) -> None:
        with _guard:
            if self._phase != _PENDING:
                return
            event = self._event
            if event is None:
                event = self._event = threading.Event()
        if not event.wait(timeout):
            raise TimeoutError()

    def add_done_callback(self, fn: Callable[[Future[T]], object]) -> None:
        if self._phase == _PENDING:
            with _guard:
                if self._phase == _PENDING:
                    if self._callbacks is None:
                        self._callbacks = [fn]
                    else:
                        self._callbacks.append(fn)
                    return
        self._call(fn)

    # ------------------------------------------------------------------ resolving

    def set_running_or_notify_cancel(self) -> bool:
        if self._phase == _CANCELLED:
            return False
        if self._phase == _PENDING:
            return True
        raise RuntimeError(f"Future in unexpected state: {self!r}")

    def set_result(self, result: T) -> None:
        with _guard:
            if self._phase != _PENDING:
                raise InvalidStateError(f"{self!r} is already done")
            self._value = result
            self._phase = _FINISHED
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        self._finish(callbacks, event)

    def set_exception(self, exception: BaseException | None) -> None:
        with _guard:
            if self._phase != _PENDING:
                raise InvalidStateError(f"{self!r} is already done")
            self._error = exception
            self._phase = _FINISHED
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        self._finish(callbacks, event)

    def cancel(self) -> bool:
        with _guard:
            if self._phase == _FINISHED:
                return False
            if self._phase == _CANCELLED:
                return True
            self._phase = _CANCELLED
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        self._finish(callbacks, event)
        return True

    def settle(self, result: Any, error: BaseException | None = None) -> None:
        """Resolve with ``result`` (or ``error``) unless already done — its caller gave
        up and cancelled it — in one call: a sync round settles every write's future
        this way (``storage/futures.py``), where ``done`` then ``set_result`` and its
        steps were four calls a write."""
        if self._phase != _PENDING:
            return
        with _guard:
            if self._phase != _PENDING:
                return
            if error is None:
                self._value = result
            else:
                self._error = error
            self._phase = _FINISHED
            callbacks, self._callbacks = self._callbacks, None
            event = self._event
        if event is not None:
            event.set()
        if callbacks is not None:
            for fn in callbacks:
                try:
                    fn(self)
                except Exception:  # as the standard Future does: one bad callback is logged
                    log.exception("exception calling callback for %r", self)

    def _finish(
        self, callbacks: list[Callable[[Future[T]], object]] | None, event: threading.Event | None
    ) -> None:
        if event is not None:
            event.set()
        if callbacks is not None:
            for fn in callbacks:
                self._call(fn)

    def _call(self, fn: Callable[[Future[T]], object]) -> None:
        try:
            fn(self)
        except Exception:  # as the standard Future does: one bad callback is logged
            log.exception("exception calling callback for %r", self)


def resolved(result: T) -> WriteFuture[T]:
    """A future already holding ``result`` (a write with nothing to make durable)."""
    fut: WriteFuture[T] = WriteFuture()
    fut._value = result
    fut._phase = _FINISHED
    return fut
