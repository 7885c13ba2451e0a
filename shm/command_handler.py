"""Turns command-ring commands into engine calls, for one client's session.

Owns the op → operation mapping of ``docs/shm.md`` ("Command ring"; each op is one of
the item operations every front end calls, ``storage/itemops.py``) and the per-session
state (the bound queue, the rest of a response too long for one slot). Invariants kept:
  - nothing a client writes reaches the engine unchecked: fields are decoded by
    ``shm/command_codec.py`` and the engine validates names, sizes and deadlines before it
    writes anything, so a hostile ring yields error responses, never a corrupt queue;
  - durable ops (PUT, DELETE, REQUEUE) go through the engine's ``*_nowait`` calls and are
    answered only once their future resolves: the same group commit and the same
    durability as an HTTP request. A run of PUTs (or DELETEs) that arrived together is
    handed to the engine as one batch (``begin_run``), as an HTTP batch would be; if the
    engine refuses the batch as a whole, nothing of it was written, and each command is
    started alone so that each gets its own answer;
  - a batch op (PUT_MANY, DELETE_MANY) is one command whose body spans the PART slots
    before it, one engine call and one answer spread over the same slots;
  - a response longer than its command's slots is handed out chunk by chunk from one
    buffer (``CONTINUE``), never copied again per chunk;
  - every command gets exactly one response; no exception escapes ``finish``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from dq.shm import command_codec as codec
from dq.shm.command_ring import (
    FLAG_DRAINING,
    FLAG_MORE,
    FLAG_NO_QUEUE,
    RESPONSE_BODY_MAX,
    RESPONSE_HEAD,
    Command,
    Op,
    Status,
    encode_response,
)
from dq.shm.errors import MalformedSlot
from dq.storage.errors import NotLeader, StorageError
from dq.storage.itemops import ItemOps
from dq.storage.types import Extend, ItemOutcome, NewItem, Release, Requeue, check_queue_name

__all__ = ["ASYNC_OPS", "MANY_OPS", "CommandHandler", "Outcome"]

log = logging.getLogger(__name__)

# Plain ints for the per-command tests: an IntEnum member's lookup costs several times an
# int comparison, and these run for every command a ring carries.
PUT, DELETE, FIND, REQUEUE, EXTEND = (
    int(Op.PUT),
    int(Op.DELETE),
    int(Op.FIND),
    int(Op.REQUEUE),
    int(Op.EXTEND),
)
BIND, CONTINUE = int(Op.BIND), int(Op.CONTINUE)
OK = int(Status.OK)
ASYNC_OPS = frozenset({Op.PUT, Op.DELETE, Op.REQUEUE})
MANY_OPS = frozenset({Op.PUT_MANY, Op.DELETE_MANY})  # durable too; their body spans PARTs
_KNOWN_OPS = frozenset(int(op) for op in Op)
FUTURE_POLL_S = 1.0
Result = tuple[int, bytes]


@dataclass(slots=True)
class Outcome:
    """A command in flight: either already answered, or a future plus how to read it."""

    result: Result | None = None
    future: concurrent.futures.Future[Any] | None = None
    finish: Callable[[Any], Result] | None = None
    encoded: bytes | None = None  # a response already cut to one slot (a continuation)
    flags: int = 0  # set in every slot of the answer beside MORE (FIND's NO_QUEUE, DRAINING)


def _status_for(code: str) -> int:
    try:
        return int(Status[code.upper()])
    except KeyError:
        return int(Status.INTERNAL)


def _error(exc: BaseException) -> Result:
    if isinstance(exc, StorageError):
        if isinstance(exc, NotLeader):  # a follower: the client goes to the leader over HTTP
            if exc.leader:
                return int(Status.NOT_LEADER), exc.leader.encode()
            return int(Status.NO_LEADER), str(exc).encode()
        status = _status_for(exc.code)
        if status == Status.INTERNAL and exc.http_status == 503:  # unavailable for now
            status = int(Status.UNAVAILABLE)
        return status, str(exc).encode()
    if isinstance(exc, MalformedSlot):
        return int(Status.MALFORMED), str(exc).encode()
    log.exception("unexpected error serving a ring command", exc_info=exc)
    return int(Status.INTERNAL), f"internal error: {type(exc).__name__}".encode()


def _item_result(outcomes: list[ItemOutcome], body: Callable[[ItemOutcome], bytes]) -> Result:
    (outcome,) = outcomes
    if outcome.error is not None:
        return _status_for(outcome.error), (outcome.message or outcome.error).encode()
    return int(Status.OK), body(outcome)


def _put_ok(done: Any) -> Result:
    return OK, codec.encode_put_ok(done.id, done.deadline)


def _put_first(done: list[Any]) -> Result:
    """A single PUT's answer from its one-item batch."""
    first = done[0]
    return OK, codec.encode_put_ok(first.id, first.deadline)


def _released(outcomes: list[ItemOutcome]) -> Result:
    """A single DELETE's answer."""
    (outcome,) = outcomes
    if outcome.error is not None:
        return _status_for(outcome.error), (outcome.message or outcome.error).encode()
    return OK, b""


def _requeued(outcomes: list[ItemOutcome]) -> Result:
    return _item_result(outcomes, _requeued_body)


def _requeued_body(outcome: ItemOutcome) -> bytes:
    return codec.encode_u64(outcome.deadline or 0)


def _extended_body(outcome: ItemOutcome) -> bytes:
    return codec.encode_extend_ok(outcome.lease_expires or 0, outcome.receipt or "")


def _empty(outcome: ItemOutcome) -> bytes:
    return b""


def _put_at(index: int, done: list[Any]) -> Result:
    return _put_ok(done[index])


def _released_at(index: int, outcomes: list[ItemOutcome]) -> Result:
    return _item_result([outcomes[index]], _empty)


def _put_many_ok(done: list[Any]) -> Result:
    return int(Status.OK), codec.encode_put_many_ok(done)


def _deleted_many(room: int, outcomes: list[ItemOutcome]) -> Result:
    statuses = [0 if o.error is None else _status_for(o.error) for o in outcomes]
    return int(Status.OK), codec.encode_delete_many_ok(statuses, outcomes, room)


class CommandHandler:
    """One session's op dispatcher. Used by that session's thread only."""

    def __init__(
        self,
        engine: Any,
        queue: str | None,
        stopping: threading.Event,
        ops: ItemOps | None = None,
        woken: threading.Event | None = None,
    ) -> None:
        self._engine = engine
        self.queue = queue
        self._stopping = stopping
        self._ops = ops if ops is not None else ItemOps(engine)
        #: what a long-polling FIND sleeps on; its session sets it when it stops
        self._woken = woken if woken is not None else threading.Event()
        self._rest = b""  # the last response when it did not fit its slot ...
        self._rest_at = 0  # ... and where its next chunk starts ...
        self._rest_flags = 0  # ... and the flags each of its chunks carries

    # ---- the two-step protocol used by the session loop ----------------------------------

    def begin(self, cmd: Command) -> Outcome:
        """Start a command: durable ops return a future, the others their result."""
        try:
            op = cmd.op
            if op != CONTINUE:
                self._rest = b""
            if cmd.value_size > 1024:
                return Outcome(
                    (int(Status.VALUE_TOO_LARGE), b"value_size exceeds the 1024-byte slot")
                )
            if op == BIND:
                self.queue = check_queue_name(cmd.value.decode("ascii", "replace"))
                return Outcome((OK, b""))
            if op == CONTINUE:
                return self._continue()
            if op not in _KNOWN_OPS:
                return Outcome((int(Status.UNKNOWN_OP), f"unknown op {cmd.op}".encode()))
            if self.queue is None:
                return Outcome((int(Status.NOT_BOUND), b"no queue bound: send BIND first"))
            return self._dispatch(cmd, self.queue)
        except Exception as exc:
            return Outcome(_error(exc))

    def begin_run(self, cmds: list[Command]) -> list[Outcome]:
        """Start consecutive PUTs (or DELETEs) as one engine batch; one outcome each."""
        if len(cmds) > 1 and self.queue is not None:
            try:
                return self._batch(cmds, self.queue)
            except Exception:  # refused as a whole (nothing written): answer one by one
                pass
        return [self.begin(cmd) for cmd in cmds]

    def _batch(self, cmds: list[Command], queue: str) -> list[Outcome]:
        self._rest = b""
        ops = self._ops
        if any(cmd.value_size > 1024 for cmd in cmds):
            raise MalformedSlot("value_size exceeds the slot")
        if cmds[0].op == Op.PUT:
            items = [NewItem(cmd.value, *codec.decode_put(cmd.key)) for cmd in cmds]
            put = ops.start_enqueue(queue, items)
            return [Outcome(future=put, finish=partial(_put_at, i)) for i in range(len(cmds))]
        if cmds[0].op == Op.DELETE:
            args = [codec.decode_item(cmd.key, cmd.value) for cmd in cmds]
            released = ops.start_release(queue, [Release(a.id, a.receipt) for a in args])
            return [
                Outcome(future=released, finish=partial(_released_at, i)) for i in range(len(cmds))
            ]
        raise MalformedSlot("only PUT and DELETE runs are batched")

    def begin_span(self, cmds: list[Command]) -> Outcome:
        """Start a command that took several slots: its PARTs, then the op itself.

        PUT_MANY and DELETE_MANY read their body from the PARTs and their own value; a
        FIND may be preceded by empty PARTs, which only give its answer room. PARTs
        before any other op, or carrying bytes before a FIND, make it malformed."""
        cmd, parts = cmds[-1], cmds[:-1]
        self._rest = b""
        try:
            if any(c.value_size > 1024 for c in cmds):
                return Outcome(
                    (int(Status.VALUE_TOO_LARGE), b"value_size exceeds the 1024-byte slot")
                )
            if cmd.op in MANY_OPS:
                if self.queue is None:
                    return Outcome((int(Status.NOT_BOUND), b"no queue bound: send BIND first"))
                return self._many(cmd, b"".join(c.value for c in cmds), len(cmds), self.queue)
            if parts and (cmd.op != Op.FIND or any(p.value for p in parts)):
                raise MalformedSlot("PART slots precede PUT_MANY, DELETE_MANY or FIND only")
            return self.begin(cmd)
        except Exception as exc:
            return Outcome(_error(exc))

    def _many(self, cmd: Command, body: bytes, slots: int, queue: str) -> Outcome:
        if cmd.op == Op.PUT_MANY:
            items = codec.decode_put_many(cmd.key, body)
            return Outcome(future=self._ops.start_enqueue(queue, items), finish=_put_many_ok)
        releases = codec.decode_delete_many(cmd.key, body)
        return Outcome(
            future=self._ops.start_release(queue, releases),
            finish=partial(_deleted_many, slots * RESPONSE_BODY_MAX),
        )

    def finish(self, outcome: Outcome, *, whole: bool = True) -> bytes:
        """Wait for a started command and return its response bytes (first chunk).
        ``whole=False`` (answers given from another thread) cuts a body that does not
        fit one slot instead of keeping the rest for CONTINUE."""
        return self.finish_span(outcome, 1, whole=whole)[0]

    def finish_span(self, outcome: Outcome, slots: int, *, whole: bool = True) -> list[bytes]:
        """``finish`` for a command that took ``slots`` slots: its answer spread over
        them, 1020 bytes each, ``MORE`` on every chunk another one follows; slots past
        the answer's end get an empty body. A longer answer is kept for CONTINUE
        (``whole``) or cut."""
        if outcome.encoded is not None:  # a continuation: never spans (begin_span)
            return [outcome.encoded] * slots
        if outcome.result is not None:
            status, body = outcome.result
        else:
            assert outcome.future is not None and outcome.finish is not None
            try:
                status, body = outcome.finish(self._wait(outcome.future))
            except Exception as exc:
                status, body = _error(exc)
        room = slots * RESPONSE_BODY_MAX
        flags = outcome.flags
        if len(body) > room:
            if whole:
                self._rest, self._rest_at, self._rest_flags = body, room, flags
            else:
                body = body[:room]
        if slots == 1:
            more = FLAG_MORE * (len(body) > room)
            return [encode_response(status, body[:RESPONSE_BODY_MAX], flags | more)]
        size = len(body)
        return [
            encode_response(
                status,
                body[at : at + RESPONSE_BODY_MAX],
                flags | FLAG_MORE * (at + RESPONSE_BODY_MAX < size),
            )
            for at in range(0, room, RESPONSE_BODY_MAX)
        ]

    def answer_one(self, outcome: Outcome) -> bytes:
        """``finish_span(outcome, 1, whole=False)[0]`` for a command whose future has
        resolved (or that was answered at once): the answer of a single-slot durable
        command, given from the thread that resolved it, without the list around it."""
        if outcome.encoded is not None:
            return outcome.encoded
        if outcome.result is not None:
            status, body = outcome.result
        else:
            assert outcome.future is not None and outcome.finish is not None
            try:
                status, body = outcome.finish(self._wait(outcome.future))
            except Exception as exc:
                status, body = _error(exc)
        if len(body) > RESPONSE_BODY_MAX:  # cut, as ``finish_span`` cuts it: no MORE
            body = body[:RESPONSE_BODY_MAX]
        return RESPONSE_HEAD.pack(status, outcome.flags, 0) + body

    def _wait(self, future: concurrent.futures.Future[Any]) -> Any:
        while True:
            try:
                return future.result(timeout=FUTURE_POLL_S)
            except concurrent.futures.TimeoutError:
                if self._stopping.is_set() and not future.running():
                    raise

    def _continue(self) -> Outcome:
        """The next chunk of the previous response (a slice of it: the rest stays put)."""
        rest, start = self._rest, self._rest_at
        if not rest:
            return Outcome((int(Status.NO_CONTINUATION), b"no response continues"))
        end = start + RESPONSE_BODY_MAX
        more = end < len(rest)
        if more:
            self._rest_at = end
        else:
            self._rest = b""
        flags = self._rest_flags | FLAG_MORE * more
        return Outcome(encoded=encode_response(int(Status.OK), rest[start:end], flags))

    # ---- ops ---------------------------------------------------------------------------------

    def _dispatch(self, cmd: Command, queue: str) -> Outcome:
        ops = self._ops
        op = cmd.op
        if op == PUT:
            deadline, delay = codec.decode_put(cmd.key)
            item = NewItem(cmd.value, deadline, delay)
            return Outcome(None, ops.start_enqueue(queue, [item]), _put_first)
        if op == DELETE:
            args = codec.decode_item(cmd.key, cmd.value)
            release = Release(args.id, args.receipt)
            return Outcome(None, ops.start_release(queue, [release]), _released)
        if op == REQUEUE:
            args = codec.decode_requeue(cmd.key, cmd.value)
            req = Requeue(args.id, args.receipt, args.arg, args.delay_ms)
            return Outcome(None, ops.start_requeue(queue, [req]), _requeued)
        if op == EXTEND:
            args = codec.decode_item(cmd.key, cmd.value)
            if args.arg is None:
                raise MalformedSlot("EXTEND needs lease_ms > 0")
            outcomes = ops.extend(queue, [Extend(args.id, args.receipt, args.arg)])
            return Outcome(_item_result(outcomes, _extended_body))
        if op == FIND:
            return self._find(queue, codec.decode_find(cmd.key))
        # Op.STATS
        stats = dataclasses.asdict(self._engine.stats(queue))
        return Outcome((int(Status.OK), json.dumps(stats, separators=(",", ":")).encode()))

    def _find(self, queue: str, args: codec.FindArgs) -> Outcome:
        """A dequeue, long-polling up to ``wait_ms`` (``storage/itemops.py``, as over
        HTTP): a queue not created yet has nothing due, and the wait goes on until it is
        (a worker may start before its producer); the answer says so (``NO_QUEUE``)."""
        got = self._ops.lease_waiting(
            queue, args.count, args.lease_ms, args.wait_ms, self._woken, self._stopping
        )
        flags = FLAG_NO_QUEUE * (not got.queue_exists) | FLAG_DRAINING * got.draining
        return Outcome((OK, codec.encode_deliveries(got)), flags=flags)
