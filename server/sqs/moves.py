"""Message move tasks (``StartMessageMoveTask``): redrive a dead-letter queue.

A task moves messages out of a dead-letter queue with the engine's ``redrive`` — back
to the queue each message died in, or to one destination — in chunks, in a worker
thread, at most ``MaxNumberOfMessagesPerSecond`` a second if given. It ends when a
chunk moves nothing (the queue is empty, or only messages that cannot move are left),
or when cancelled between chunks; a task that leaves messages behind (in flight, or
refused) ends ``FAILED`` with a ``FailureReason`` saying why. Tasks live in memory: ``ListMessageMoveTasks``
reports the recent ones of a source queue; a restart forgets them (a move already made
stays made: each chunk is durable before the next starts).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dq.storage.errors import StorageError

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = ["MoveTask", "MoveTasks"]

log = logging.getLogger(__name__)

_CHUNK = 100
#: Tasks kept per source queue for ``ListMessageMoveTasks`` (SQS lists at most 10).
_KEEP = 10


@dataclass(slots=True)
class MoveTask:
    handle: str
    source: str
    destination: str | None
    source_arn: str
    destination_arn: str | None
    rate: int | None
    to_move: int
    started_ms: int
    status: str = "RUNNING"
    moved: int = 0
    failure: str | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


class MoveTasks:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tasks: dict[str, list[MoveTask]] = {}
        self._counter = 0

    def running(self, source: str) -> MoveTask | None:
        with self._lock:
            return next(
                (t for t in self._tasks.get(source, []) if t.status in ("RUNNING", "CANCELLING")),
                None,
            )

    def start(
        self,
        engine: Engine,
        source: str,
        destination: str | None,
        arns: tuple[str, str | None],
        rate: int | None,
        to_move: int,
    ) -> MoveTask:
        with self._lock:
            self._counter += 1
            token = json.dumps({"source": source, "n": self._counter, "t": time.time_ns()})
            handle = base64.urlsafe_b64encode(token.encode()).decode()
            task = MoveTask(
                handle, source, destination, arns[0], arns[1], rate, to_move, engine.now()
            )
            tasks = self._tasks.setdefault(source, [])
            tasks.insert(0, task)
            del tasks[_KEEP:]
        threading.Thread(
            target=self._run, args=(engine, task), name=f"dq-sqs-move-{source}", daemon=True
        ).start()
        return task

    def find(self, handle: str) -> MoveTask | None:
        with self._lock:
            for tasks in self._tasks.values():
                for t in tasks:
                    if t.handle == handle:
                        return t
        return None

    def list(self, source: str) -> list[MoveTask]:
        with self._lock:
            return list(self._tasks.get(source, []))

    def _run(self, engine: Engine, task: MoveTask) -> None:
        chunk = _CHUNK if task.rate is None else max(1, min(_CHUNK, task.rate))
        #: messages a chunk could not move, by id (they stay in the queue, and each
        #: later chunk meets them again)
        refused: dict[int, str] = {}
        try:
            while not task.cancel.is_set():
                t0 = time.monotonic()
                result = engine.redrive(task.source, to=task.destination, limit=chunk)
                task.moved += result.moved
                for outcome in result.failed:
                    refused[outcome.id] = f"{outcome.error}: {outcome.message or outcome.error}"
                if result.moved == 0:
                    break
                if task.rate is not None:
                    time.sleep(max(0.0, result.moved / task.rate - (time.monotonic() - t0)))
            if task.cancel.is_set():
                task.status = "CANCELLED"
                return
            in_flight = engine.stats(task.source).leased
        except StorageError as exc:
            task.status, task.failure = "FAILED", f"{exc.code}: {exc.message}"
            return
        except Exception as exc:  # a bug: report it on the task, not as a silent thread death
            log.exception("message move task from %s failed", task.source)
            task.status, task.failure = "FAILED", f"internal error: {exc}"
            return
        task.failure = _left_behind(task.moved, in_flight, refused)
        task.status = "COMPLETED" if task.failure is None else "FAILED"


def _left_behind(moved: int, in_flight: int, refused: dict[int, str]) -> str | None:
    """Why a task that ran to its end left messages behind, or None if it left none.

    As in SQS, a task reports a ``FailureReason`` only with the status ``FAILED``: so a
    task that could not move every message it found ends ``FAILED``, and the reason
    says how many it moved and why the others stayed. A message in flight (received
    from the dead-letter queue and neither deleted nor visible again) is not moved: the
    receiver holds it, and moving it would end its receipt handle under it."""
    reasons = []
    if in_flight:
        reasons.append(
            f"{_messages(in_flight)} in flight (received and not yet deleted or visible "
            f"again) and not moved: start a new task once {_pronoun(in_flight)} visible"
        )
    if refused:
        first = next(iter(refused.values()))
        reasons.append(f"{_messages(len(refused))} could not be moved ({first})")
    if not reasons:
        return None
    return f"{_messages(moved)} moved; " + "; ".join(reasons)


def _pronoun(n: int) -> str:
    return "it is" if n == 1 else "they are"


def _messages(n: int) -> str:
    return f"{n} message was" if n == 1 else f"{n} messages were"
