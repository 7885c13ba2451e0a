"""``WriteFuture`` behaves as ``concurrent.futures.Future`` does for everything the
engine's callers use: blocking waits across threads, timeouts, callbacks, cancel,
errors, ``settle`` and ``asyncio.wrap_future``."""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import CancelledError, Future, InvalidStateError
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig
from dq.storage.futures import answer, settle
from dq.storage.types import NewItem, Release
from dq.storage.write_future import WriteFuture, resolved


def test_result_waits_for_another_thread() -> None:
    fut: WriteFuture[int] = WriteFuture()
    assert not fut.done() and not fut.running() and not fut.cancelled()
    timer = threading.Timer(0.05, fut.set_result, (7,))
    timer.start()
    try:
        assert fut.result(timeout=10) == 7
    finally:
        timer.cancel()
    assert fut.done() and fut.exception() is None


def test_timeout_raises_and_a_later_result_still_arrives() -> None:
    fut: WriteFuture[str] = WriteFuture()
    with pytest.raises(TimeoutError):
        fut.result(timeout=0.01)
    with pytest.raises(TimeoutError):
        fut.exception(timeout=0.01)
    fut.set_result("ok")
    assert fut.result(timeout=0) == "ok"


def test_many_waiters_race_the_setter() -> None:
    for _ in range(200):
        fut: WriteFuture[int] = WriteFuture()
        got: list[int] = []

        def wait(f: WriteFuture[int] = fut, into: list[int] = got) -> None:
            into.append(f.result(timeout=10))

        waiters = [threading.Thread(target=wait) for _ in range(3)]
        for w in waiters:
            w.start()
        fut.set_result(1)
        for w in waiters:
            w.join(10)
        assert got == [1, 1, 1]


def test_exception_is_raised_by_result_and_returned_by_exception() -> None:
    fut: WriteFuture[int] = WriteFuture()
    error = OSError("disk")
    fut.set_exception(error)
    assert fut.exception() is error
    with pytest.raises(OSError, match="disk"):
        fut.result()


def test_callbacks_run_once_in_order_and_at_once_when_done() -> None:
    fut: WriteFuture[int] = WriteFuture()
    calls: list[tuple[str, Any]] = []
    fut.add_done_callback(lambda f: calls.append(("a", f.result())))
    fut.add_done_callback(lambda f: calls.append(("b", f.result())))
    assert calls == []
    fut.set_result(3)
    fut.add_done_callback(lambda f: calls.append(("c", f.result())))
    assert calls == [("a", 3), ("b", 3), ("c", 3)]


def test_a_failing_callback_is_logged_and_the_others_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fut: WriteFuture[int] = WriteFuture()
    ran: list[int] = []

    def bad(_f: Future[int]) -> None:
        raise RuntimeError("boom")

    fut.add_done_callback(bad)
    fut.add_done_callback(lambda f: ran.append(f.result()))
    with caplog.at_level(logging.ERROR):
        fut.set_result(5)
    assert ran == [5]
    assert "exception calling callback" in caplog.text


def test_set_twice_or_after_cancel_is_an_invalid_state() -> None:
    fut: WriteFuture[int] = WriteFuture()
    fut.set_result(1)
    with pytest.raises(InvalidStateError):
        fut.set_result(2)
    with pytest.raises(InvalidStateError):
        fut.set_exception(OSError())
    assert not fut.cancel() and fut.result() == 1

    gone: WriteFuture[int] = WriteFuture()
    seen: list[bool] = []
    gone.add_done_callback(lambda f: seen.append(f.cancelled()))
    assert gone.cancel() and gone.cancel()
    assert gone.cancelled() and gone.done() and seen == [True]
    assert not gone.set_running_or_notify_cancel()
    with pytest.raises(InvalidStateError):
        gone.set_result(1)
    with pytest.raises(CancelledError):
        gone.result()
    with pytest.raises(CancelledError):
        gone.exception()


def test_settle_leaves_a_cancelled_future_alone_and_answers_the_rest() -> None:
    cancelled: WriteFuture[int] = WriteFuture()
    cancelled.cancel()
    settle(cancelled, 1)
    fut: WriteFuture[int] = WriteFuture()
    settle(fut, None, OSError("x"))
    assert isinstance(fut.exception(), OSError)
    settle(fut, 2)  # already done: nothing changes
    assert isinstance(fut.exception(), OSError)


def test_a_cancel_that_blocks_a_waiter_wakes_it() -> None:
    fut: WriteFuture[int] = WriteFuture()
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            fut.result(timeout=10)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=wait)
    t.start()
    threading.Timer(0.05, fut.cancel).start()
    t.join(10)
    assert len(errors) == 1 and isinstance(errors[0], CancelledError)


def test_asyncio_wrap_future_follows_it() -> None:
    async def main() -> int:
        fut: WriteFuture[int] = WriteFuture()
        asyncio.get_running_loop().call_later(0.01, fut.set_result, 9)
        return await asyncio.wait_for(asyncio.wrap_future(fut), 10)

    assert asyncio.run(main()) == 9


def test_resolved_is_done_with_its_result() -> None:
    fut = resolved([1])
    assert fut.done() and fut.result() == [1] and fut.exception() is None
    assert isinstance(fut, Future)


def test_engine_writes_answer_write_futures(tmp_path: Any) -> None:
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always", compaction="inline")) as eng:
        fut = eng.enqueue_nowait("q", [NewItem(b"x")])
        assert isinstance(fut, WriteFuture)
        (done,) = fut.result(timeout=30)
        (got,) = eng.dequeue("q")
        rel = eng.release_nowait("q", [Release(got.id, got.receipt)])
        assert isinstance(rel, WriteFuture)
        assert rel.result(timeout=30)[0].error is None and got.id == done.id
        stale = eng.release_nowait("q", [Release(got.id, got.receipt)])
        assert stale.done() and stale.result()[0].error is not None


def test_answer_settles_write_futures_in_one_step_as_settle_does(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sync round's ``answer``: a cancelled future stays cancelled and the others of
    the round are answered, a blocked waiter wakes, callbacks run once in order (a
    failing one logged), and a standard ``Future`` is settled too."""
    cancelled: WriteFuture[int] = WriteFuture()
    cancelled.cancel()
    ok: WriteFuture[int] = WriteFuture()
    failed: WriteFuture[int] = WriteFuture()
    plain: Future[int] = Future()
    ran: list[tuple[str, Any]] = []

    def bad(_f: Future[int]) -> None:
        raise RuntimeError("boom")

    ok.add_done_callback(bad)
    ok.add_done_callback(lambda f: ran.append(("ok", f.result())))
    failed.add_done_callback(lambda f: ran.append(("failed", type(f.exception()))))
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(ok.result(timeout=30)))
    waiter.start()
    with caplog.at_level(logging.ERROR):
        answer(
            [(cancelled, 1, None), (ok, 2, None), (failed, None, OSError("x")), (plain, 4, None)]
        )
    waiter.join(timeout=30)
    assert cancelled.cancelled() and got == [2]
    assert ran == [("ok", 2), ("failed", OSError)]
    assert "exception calling callback" in caplog.text
    assert plain.result(timeout=0) == 4
    answer([(ok, 9, None), (failed, 9, None)])  # already done: nothing changes
    assert ok.result() == 2 and isinstance(failed.exception(), OSError)
    assert ran == [("ok", 2), ("failed", OSError)]


def test_a_sync_round_tells_the_watchers_once_for_a_write(tmp_path: Any) -> None:
    """One publication wakes one long-poll (``storage/waits.py``): a sync round that
    publishes one enqueue, or one release, tells the queue's watchers once."""
    with Engine.open(tmp_path / "d", EngineConfig(fsync="always", compaction="inline")) as eng:
        eng.enqueue("q", [NewItem(b"x")])
        q = eng.queue("q")
        told: list[int] = []
        eng.watch("q", lambda: told.append(1))
        assert eng.syncer is not None
        eng.syncer.stop()  # the rounds are run here, by hand
        fut = eng.enqueue_nowait("q", [NewItem(b"y")])
        q.sync_round()
        assert fut.result(timeout=0) and len(told) == 1
        (got,) = eng.dequeue("q")
        rel = eng.release_nowait("q", [Release(got.id, got.receipt)])
        q.sync_round()
        assert rel.result(timeout=0)[0].error is None and len(told) == 2
