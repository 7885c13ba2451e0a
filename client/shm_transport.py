"""The shared-memory transport: ``Client("shm:///path/to/data-dir")``.

Speaks the command ring of ``docs/shm.md`` to a server on the same host. Its one method,
``call``, serves the calls the ring carries (``client/_calls.py``: enqueue, dequeue,
release, requeue, extend, a queue's stats, health), each mapped onto its ring commands
here, and hands every other call whole to an ``HttpTransport``, in one place
(``_hand_on``). Invariants kept:
  - the same answers and errors as over HTTP: ring status codes become the same
    ``ClientError`` classes, per-item release/requeue/extend problems the same
    ``Outcome``s, and arguments a ring field would misread are refused as the HTTP API
    refuses them, before anything is sent;
  - a batch is one command: PUT_MANY / DELETE_MANY, their body spread over PART slots,
    answered in the same slots (one engine call, one wake-up each way); a dequeue of
    many sends empty PARTs before its FIND so that the answer has room; single items
    keep the one-slot PUT / DELETE / FIND;
  - what a ring cannot carry goes over HTTP (the URL comes from the attach handshake),
    transparently: queue administration and the operator calls, and an enqueue batch
    too big for one command (more than ``capacity - 1`` slots; sent whole, so it keeps
    its all-or-nothing validation and id order);
  - one ring per transport, used under its lock; commands are pipelined (up to
    ``capacity - 1`` slots in flight) so their durable writes share a group commit;
  - on a follower of a replicated deployment the ring refuses writes and dequeues
    (``not_leader``, body: the leader's URL; ``no_leader``) before doing anything: the
    refused commands are sent again over HTTP, which follows the leader, and so is every
    such call for ``HTTP_SPELL_S``; then the ring is tried again (the local server may
    lead). A queue's stats and health are any server's: they stay on the ring.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from dq.client import _wire
from dq.client._calls import (
    Call,
    Dequeue,
    EnqueueMany,
    EnqueueOne,
    ExtendMany,
    GetQueue,
    Health,
    ItemBatch,
    ReleaseMany,
    ReleaseOne,
    RequeueMany,
)
from dq.client._common import check_outcome
from dq.client.errors import ClientError, TransportError, error_for
from dq.client.types import (
    Dequeued,
    Enqueued,
    Extend,
    Item,
    ItemStats,
    NewItem,
    Outcome,
    QueueInfo,
    Release,
    Requeue,
)
from dq.shm import command_codec as codec
from dq.shm.attach import Attachment, attach
from dq.shm.command_ring import (
    DEFAULT_SPIN_US,
    FLAG_DRAINING,
    FLAG_NO_QUEUE,
    KEY_SIZE,
    RESPONSE_BODY_MAX,
    VALUE_MAX,
    ClientRing,
    Op,
    Response,
    Status,
)
from dq.shm.errors import ShmError
from dq.storage.validation import (
    DEADLINE,
    DELAY_MS,
    LEASE_MS,
    NOT_BOTH,
    RECEIPT,
    WAIT_MS,
    Range,
    count_range,
)

if TYPE_CHECKING:
    from dq.client._http import HttpTransport

__all__ = ["HTTP_SPELL_S", "LONG_POLL_SLICE_MS", "AsyncShmTransport", "ShmTransport"]

#: how long a transport whose ring said "not the leader" sends its calls over HTTP
HTTP_SPELL_S = 5.0
#: the longest FIND a long-poll sends: the ring is free for the client's other threads,
#: and a cancelled async long-poll ends, within it
LONG_POLL_SLICE_MS = 250
_FOLLOWER = frozenset({Status.NOT_LEADER, Status.NO_LEADER})
_DEFAULT_TIMEOUT = 30.0
#: a count the ring's u32 field holds, for a server that does not say its batch limit
_RING_COUNT = count_range(0xFFFFFFFF)
_ITEM_ERRORS = frozenset({"stale_receipt", "item_not_found", "invalid_receipt"})
_ZERO_KEY = bytes(KEY_SIZE)
_ON_DUPLICATE = frozenset({"keep", "replace"})  # what a repeated key may do
_DELIVERY_GUESS = 330  # bytes per delivery in a FIND answer before one was seen
R = TypeVar("R")
Command = tuple[int, bytes, bytes]
#: a successful item's outcome from its answer's body
OkOutcome = Callable[[int, bytes], Outcome]
Span = list[Command]  # one command: its PART slots, then the op's own slot
_RELEASED = Response(Status.OK, 0, b"")
#: the key of a PUT with no deadline and no delay (due now), and of a FIND of one item
#: that does not wait, with the queue's lease (``codec.encode_put``/``encode_find``)
_PUT_NOW = codec.encode_put(None, None)
_FIND_ONE_NOW = codec.encode_find(1, 0, None)
#: below this many bytes per delivery, one item's FIND answer is expected to fit its
#: own slot (``_find_span`` sends no PARTs before it)
_ONE_FIND_BYTES = RESPONSE_BODY_MAX - 4 + 1
_U64 = codec.U64  # a PUT answer's id
_DELETE_KEY = codec.KEY2  # a DELETE's key: id u64 | 0
# Plain ints for the per-call tests: an IntEnum member's lookup costs several times an
# int comparison.
_OK, _NOT_LEADER = int(Status.OK), int(Status.NOT_LEADER)
_PUT, _DELETE, _FIND, _PART, _BIND = (
    int(Op.PUT),
    int(Op.DELETE),
    int(Op.FIND),
    int(Op.PART),
    int(Op.BIND),
)  # one item's answer in a DELETE_MANY that released all


def _status(status: int) -> Status:
    try:
        return Status(status)
    except ValueError:
        return Status.INTERNAL


def _code(status: int) -> str:
    return _status(status).code


def _raise(response: Response, queue: str | None, item_id: int | None = None) -> NoReturn:
    status = _status(response.status)
    message = response.body.decode("utf-8", "replace")
    raise error_for(status.http_status, status.code, message, queue=queue, id=item_id)


def _check_when(deadline: int | None, delay_ms: int | None) -> None:
    """The checks the server applies to a new item's time, for a whole batch before
    writing any of it, in its words (``storage/validation.py``)."""
    if deadline is not None:
        if delay_ms is not None:
            raise error_for(422, "validation_error", NOT_BOTH)
        _check(DEADLINE, deadline)
    elif delay_ms is not None:
        _check(DELAY_MS, delay_ms)


def _check(rule: Range, value: int | None) -> None:
    """Refuse what the server refuses (422, in its words: ``storage/validation.py``)
    where the ring would misread it: in a ring field 0 means "not given" (a count of 0
    would lease one item, a lease of 0 the queue's default) and a negative number does
    not fit at all."""
    if value is not None and not rule.holds(value):
        raise error_for(422, "validation_error", rule.message)


def _check_receipts(receipts: Sequence[str]) -> None:
    """A receipt longer than the server takes is refused as there (422): on the ring it
    could fill no slot, and came back as a TransportError, as if the server were away."""
    for receipt in receipts:
        if len(receipt) > RECEIPT.high:
            raise error_for(422, "validation_error", RECEIPT.message)


def _ascii(receipt: str) -> bool:
    return receipt.isascii() and bool(receipt)


def _released_ok(item_id: int, body: bytes) -> Outcome:
    return Outcome(item_id, True)


def _requeue_command(b: Requeue) -> Command:
    return (Op.REQUEUE, *codec.encode_requeue(b.id, b.receipt, b.deadline, b.delay_ms))


def _requeued_ok(item_id: int, body: bytes) -> Outcome:
    return Outcome(item_id, True, deadline=codec.decode_u64(body))


def _extend_command(b: Extend) -> Command:
    return (Op.EXTEND, *codec.encode_extend(b.id, b.receipt, b.lease_ms))


def _extended_ok(item_id: int, body: bytes) -> Outcome:
    expires, receipt = codec.decode_extend_ok(body)
    return Outcome(item_id, True, receipt=receipt, lease_expires=expires)


#: Bumped in a child after ``fork()`` (a ``getpid()`` per call was a syscall per call).
_generation = 0


def _forked() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forked)


class ShmTransport:
    """Blocking transport over one command ring (``Transport`` of ``client/_transport.py``)."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = _DEFAULT_TIMEOUT,
        token: str | None = None,
        http_url: str | None = None,
        http_urls: Sequence[str] = (),
        capacity: int = 256,
        spin_us: float = DEFAULT_SPIN_US,
        retries: int = 3,
        failover_s: float | None = None,
    ) -> None:
        if not url.startswith("shm://") or len(url) <= len("shm://"):
            raise TransportError(f"{url}: expected shm:///path/to/data-dir")
        self.url = url
        self.data_dir = url[len("shm://") :]
        self._timeout = timeout
        self._capacity, self._spin_us = capacity, spin_us
        self._attach_lock = threading.Lock()
        #: calls of this transport's threads waiting for a ring's lock (``_wait_for``),
        #: which a long-poll lets go first between two slices (``_let_waiting_go``)
        self._waiting = 0
        self._waiting_changed = threading.Condition(threading.Lock())
        self._retired: list[tuple[ClientRing, Attachment]] = []  # rings of servers gone
        self._attachment, self._ring = self._attach()
        self._http_url_given = http_url
        self.http_url = http_url or self._attachment.http_url
        #: the other nodes of a replicated deployment (HTTP), when given
        self.http_urls = list(http_urls)
        self._http_options: dict[str, Any] = {"timeout": timeout, "retries": retries}
        if token:
            self._http_options["token"] = token
        if failover_s is not None:
            self._http_options["failover_s"] = failover_s
        self._http: HttpTransport | None = None
        self._http_until = 0.0  # calls go over HTTP until then (the ring said: not the leader)
        self._bound: str | None = None
        self._generation = _generation
        self._delivery_bytes = _DELIVERY_GUESS  # the last FIND answer's, per delivery

    # ---- plumbing ------------------------------------------------------------------------

    def _attach(self) -> tuple[Attachment, ClientRing]:
        try:
            attachment = attach(
                self.data_dir, capacity=self._capacity, timeout_s=self._timeout, groups=True
            )
        except ShmError as exc:
            raise TransportError(f"{self.url}: cannot attach: {exc}") from exc
        try:
            ring = ClientRing(
                attachment.mm, spin_us=self._spin_us, server_gone=attachment.server_gone
            )
        except ShmError as exc:
            attachment.close()
            raise TransportError(f"{self.url}: cannot attach: {exc}") from exc
        return attachment, ring

    def _live_ring(self) -> ClientRing:
        """The ring, attached again if its server is gone (stopped, crashed, restarted),
        as the HTTP client opens a new connection: the call that was waiting when the
        server went failed (its outcome unknown), the next ones reach the server serving
        the data directory now, or fail at once while there is none."""
        ring = self._ring
        if not ring.server_lost:
            return ring
        with self._attach_lock:
            if self._ring is ring:
                old = self._attachment
                self._attachment, self._ring = self._attach()
                self._bound = None
                if self._http_url_given is None and self._attachment.http_url != self.http_url:
                    self.http_url = self._attachment.http_url  # the new server's port
                    if self._http is not None:
                        self._http.close()
                        self._http = None
                # another thread may still be parked on the old mapping for a moment:
                # it is unmapped at close(), never under a waiter
                old.sock.close()
                self._retired.append((ring, old))
            return self._ring

    def _http_transport(self) -> HttpTransport:
        if self._http is None:
            urls = [u for u in (self.http_url, *self.http_urls) if u]
            if not urls:
                raise TransportError(f"{self.url}: this needs HTTP and the server has none")
            from dq.client._http import HttpTransport

            self._http = HttpTransport(urls, **self._http_options)
        return self._http

    def _over_http(self) -> bool:
        """Within a spell of HTTP calls after the ring named another leader."""
        return self._http_until > 0 and time.monotonic() < self._http_until

    def _refused(self, responses: Sequence[Response]) -> list[int]:
        """Which commands a follower refused (nothing was done for them); starts a
        spell of HTTP calls, at the leader the ring named."""
        refused = [i for i, r in enumerate(responses) if r.status in _FOLLOWER]
        if refused:
            http = self._http_transport()
            for r in responses:
                if r.status == _NOT_LEADER and r.body:
                    http.prefer(r.body.decode("utf-8", "replace"))
                    break
            self._http_until = time.monotonic() + HTTP_SPELL_S
        return refused

    def _span(self, op: int, key: bytes, body: bytes) -> Span | None:
        """One command whose ``body`` is cut into PART slots; None if it would take more
        than ``capacity - 1`` slots (it could never be in the ring whole)."""
        pieces = [body[i : i + VALUE_MAX] for i in range(0, len(body), VALUE_MAX)] or [b""]
        if len(pieces) >= self._ring.capacity:
            return None
        return [(_PART, _ZERO_KEY, p) for p in pieces[:-1]] + [(op, key, pieces[-1])]

    def _one(
        self, queue: str, op: int, key: bytes, value: bytes, timeout: float | None = None
    ) -> tuple[int, int, bytes]:
        """One command of one slot to ``queue`` and its answer (status, flags, body): the
        round trip of a one-item call, in as few Python calls as it takes (no span, no
        list of answers, no ``Response``: ``ClientRing.exchange``)."""
        ring = self._ring
        if ring.server_lost:
            ring = self._live_ring()
        if self._generation != _generation:
            # a forked child shares the ring with its parent: two producers would collide
            raise TransportError(f"{self.url}: a shm client cannot cross fork(); open a new one")
        if timeout is None:
            timeout = self._timeout
        lock = ring.lock
        if not lock.acquire(False):
            self._wait_for(lock)
        try:
            if self._bound != queue:
                self._bind_locked(ring, queue, timeout)
            return ring.exchange(op, key, value, timeout)
        except ClientError:
            raise
        except (ShmError, ValueError) as exc:
            self._bound = None
            raise TransportError(f"{self.url}: {exc}") from exc
        finally:
            lock.release()

    def _wait_for(self, lock: threading.Lock) -> None:
        """Take ``lock``, held by another thread, counted meanwhile among the calls
        waiting for the ring (so a long-poll between two slices lets this one go first)."""
        changed = self._waiting_changed
        with changed:
            self._waiting += 1
        try:
            lock.acquire()
        finally:
            with changed:
                self._waiting -= 1
                changed.notify_all()

    def _let_waiting_go(self, end: float) -> None:
        """Between two slices of a long-poll: the calls of the client's other threads
        that wait for the ring take it first (for one slice at most, and never past the
        long-poll's end). A lock is no queue: the poller, running, took it back before a
        waiter it woke was given a CPU, slice after slice on a busy machine, and an
        enqueue waited 3.5 s behind a long-poll of 5 s sliced in 250 ms."""
        changed = self._waiting_changed
        until = min(end, time.monotonic() + LONG_POLL_SLICE_MS / 1000)
        with changed:
            while self._waiting:
                left = until - time.monotonic()
                if left <= 0:
                    return
                changed.wait(left)

    def _bind_locked(self, ring: ClientRing, queue: str, timeout: float) -> None:
        """BIND the ring to ``queue`` (the commands that follow act on it). Caller holds
        the ring's lock."""
        bound = ring.call_locked(_BIND, _ZERO_KEY, queue.encode(), timeout)
        if bound.status != _OK:
            _raise(bound, queue)
        self._bound = queue

    def _run(
        self, queue: str, commands: Sequence[Span], timeout: float | None = None
    ) -> list[Response]:
        """Send ``commands`` (each one or more slots) to ``queue`` pipelined; one joined
        response per command, in order."""
        if len(commands) == 1 and len(commands[0]) == 1:
            return [Response(*self._one(queue, *commands[0][0], timeout))]
        ring = self._live_ring()
        timeout = self._timeout if timeout is None else timeout
        if self._generation != _generation:
            # a forked child shares the ring with its parent: two producers would collide
            raise TransportError(f"{self.url}: a shm client cannot cross fork(); open a new one")
        if not commands:
            return []
        lock = ring.lock
        if not lock.acquire(False):
            self._wait_for(lock)
        try:
            if self._bound != queue:
                self._bind_locked(ring, queue, timeout)
            window = ring.capacity - 1
            inflight: deque[list[int]] = deque()
            used = 0
            out: list[Response] = []
            for span in commands:
                while inflight and used + len(span) > window:
                    ring.wake_server()
                    slots = inflight.popleft()
                    used -= len(slots)
                    out.append(ring.collect(slots, timeout))
                slots = ring.submit_span(span, timeout)
                inflight.append(slots)
                used += len(slots)
            ring.wake_server()  # once per burst: the server takes it in one pass
            while inflight:
                out.append(ring.collect(inflight.popleft(), timeout))
            out[-1] = ring.complete(out[-1], timeout)  # only the last may continue
            return out
        except ClientError:
            raise
        except (ShmError, ValueError) as exc:
            self._bound = None
            raise TransportError(f"{self.url}: {exc}") from exc
        finally:
            lock.release()

    def _deletes(self, releases: Sequence[Release]) -> tuple[list[Span], bool]:
        """The commands that release ``releases``: one DELETE_MANY for two or more (when
        it fits the ring), else a DELETE each; and whether it is the DELETE_MANY."""
        if len(releases) > 1:
            key, body = codec.encode_delete_many([(r.id, r.receipt) for r in releases])
            span = self._span(Op.DELETE_MANY, key, body)
            if span is not None:
                return [span], True
        return [[(Op.DELETE, *codec.encode_item(r.id, r.receipt))] for r in releases], False

    @staticmethod
    def _per_item(response: Response, count: int) -> list[Response]:
        """A DELETE_MANY's answer as the ``count`` DELETE answers it stands for."""
        if response.status != _OK:  # refused as a whole: the same for every item
            return [response] * count
        if response.body == bytes(count):  # every item released
            return [_RELEASED] * count
        return [
            Response(status, 0, message.encode())
            for status, message in codec.decode_delete_many_ok(response.body, count)
        ]

    def _outcomes(
        self, call: ItemBatch[Any], command: Callable[[Any], Command] | None, ok: OkOutcome
    ) -> list[Outcome]:
        """One outcome per item of ``call``, in order: a command each (``command(item)``),
        or for releases one DELETE_MANY; the items a follower refused go over HTTP as a
        call of their own."""
        queue, batch = call.queue, call.batch
        _check_receipts([b.receipt for b in batch])
        sendable = [i for i, b in enumerate(batch) if _ascii(b.receipt)]
        if command is None:
            spans, many = self._deletes([batch[i] for i in sendable])
            answers = self._run(queue, spans)
            if many:
                answers = self._per_item(answers[0], len(sendable))
        else:
            answers = self._run(queue, [[command(batch[i])] for i in sendable])
        refused = [sendable[i] for i in self._refused(answers)]
        again: dict[int, Outcome] = {}
        if refused:
            resent = self._hand_on(call.part([batch[i] for i in refused]))
            again = dict(zip(refused, resent, strict=True))
        responses = dict(zip(sendable, answers, strict=True))
        return [
            again[i] if i in again else self._outcome(queue, b.id, responses.get(i), ok)
            for i, b in enumerate(batch)
        ]

    @staticmethod
    def _outcome(queue: str, item_id: int, r: Response | None, ok: OkOutcome) -> Outcome:
        """One item's outcome; ``None``: its receipt could not be sent (not ASCII)."""
        if r is None:
            return Outcome(item_id, False, "invalid_receipt", "receipt is not ASCII")
        if r.status == _OK:
            return ok(item_id, r.body)
        if _code(r.status) in _ITEM_ERRORS:
            return Outcome(item_id, False, _code(r.status), r.body.decode("utf-8", "replace"))
        _raise(r, queue, item_id)

    # ---- the one method --------------------------------------------------------------------

    def call(self, call: Call[R]) -> R:
        """Serve ``call`` over the ring when the ring carries it; hand it to the HTTP
        transport otherwise (queue administration, operator calls), and, for a spell
        after a follower's ring refused, the calls a follower refuses."""
        kind = type(call)
        serve = _LEADER_CALLS.get(kind)
        if serve is None:
            serve = _ANY_SERVER_CALLS.get(kind)
        elif self._http_until and self._over_http():
            serve = None
        if serve is None:
            return self._hand_on(call)
        result: R = serve(self, call)
        return result

    def _hand_on(self, call: Call[R]) -> R:
        """``call`` over HTTP: the calls the ring does not carry, and those it could not
        (too big for one command, refused by a follower)."""
        return self._http_transport().call(call)

    # ---- the calls the ring carries ------------------------------------------------------

    def _enqueue_one(self, call: EnqueueOne) -> int:
        """A PUT; an item with a key or a value over a slot goes as ``enqueue_many`` of
        one would (a PUT_MANY)."""
        value, deadline, delay_ms = call.value, call.deadline, call.delay_ms
        if call.key is not None or len(value) > VALUE_MAX or deadline == 0:
            return self._enqueue_many(EnqueueMany(call.queue, [call.item()]))[0].id
        if deadline is None and delay_ms is None:  # the common call: nothing to check
            put = _PUT_NOW
        else:
            _check_when(deadline, delay_ms)
            put = codec.encode_put(deadline, delay_ms)
        status, flags, body = self._one(call.queue, _PUT, put, value)
        if status == _OK and len(body) == 16:
            item_id: int = _U64.unpack_from(body)[0]
            return item_id
        if status != _OK:
            r = Response(status, flags, body)
            if self._refused([r]):
                return self._hand_on(call)
            _raise(r, call.queue)
        return codec.decode_put_ok(body)[0]  # raises: the answer is malformed

    def _enqueue_many(self, call: EnqueueMany) -> list[Enqueued]:
        """One PUT_MANY (one PUT for an item the ring's PUT holds). Over HTTP whole: what
        does not fit one command, what a follower refused, a batch with a deadline of 0,
        which a ring field cannot tell from "not given" (an item due at the epoch sorts
        first; one due now, last), one with a group, which the ring's commands do not
        carry, and one whose keyed items mix ``on_duplicate`` "keep" and "replace"
        (PUT_MANY's REPLACE flag is the whole batch's)."""
        queue, items = call.queue, call.items
        span = self._put_span(items) if items else None
        if span is None:
            return self._hand_on(call)
        (r,) = self._run(queue, [span])
        if self._refused([r]):
            return self._hand_on(call)
        if r.status != _OK:
            _raise(r, queue)
        if span[-1][0] == _PUT:
            return [Enqueued(*codec.decode_put_ok(r.body))]
        return [Enqueued(*done) for done in codec.decode_put_many_ok(r.body, len(items))]

    def _put_span(self, items: Sequence[NewItem]) -> Span | None:
        how: set[str] = set()  # what the keyed items do with a repeated key
        for item in items:
            _check_when(item.deadline, item.delay_ms)
            if item.deadline == 0:  # "not given" (now) on the ring; the epoch over HTTP
                return None
            if item.group is not None:  # the ring's PUT carries no group: HTTP does
                return None
            if item.key is not None:
                how.add(item.on_duplicate)
        if len(how) > 1 or not how <= _ON_DUPLICATE:  # REPLACE is the batch's flag: a
            return None  # mix, or a word the server refuses, goes over HTTP
        one = items[0]
        if len(items) == 1 and one.key is None and len(one.value) <= VALUE_MAX:
            return [(_PUT, codec.encode_put(one.deadline, one.delay_ms), one.value)]
        try:
            key, body = codec.encode_put_many(
                [(i.value, i.deadline, i.delay_ms, i.key) for i in items],
                replace=how == {"replace"},
            )
        except ValueError:  # a key too long for the ring: the server's answer over HTTP
            return None
        return self._span(Op.PUT_MANY, key, body)

    def _find_span(self, count: int, wait_ms: int, lease_ms: int | None, free: int) -> Span:
        """A FIND, after as many empty PARTs as its answer is expected to need (from the
        last answer's size per delivery), at most ``free`` slots in all."""
        find: Command = (_FIND, codec.encode_find(count, wait_ms, lease_ms), b"")
        need = (4 + count * self._delivery_bytes + RESPONSE_BODY_MAX - 1) // RESPONSE_BODY_MAX
        if need <= 1 or free <= 1:
            return [find]
        part: Command = (_PART, _ZERO_KEY, b"")
        return [part] * (min(need, free) - 1) + [find]

    def _deliveries(self, body: bytes, flags: int) -> list[Item]:
        """A FIND answer's items; its ``flags`` say whether they carry their groups
        (``FLAG_GROUPS``: this client asks at attach; a server that predates it sends
        none, and the items have ``group`` None)."""
        got = [
            Item(i, receipt, value, dl, ItemStats(enq, req, dq), exp, group)
            for i, receipt, value, dl, enq, req, dq, exp, group in codec.delivery_fields(
                body, flags
            )
        ]
        if got:
            self._delivery_bytes = max(64, (len(body) - 4) // len(got) + 1)
        return got

    def _dequeue(self, call: Dequeue, cancelled: threading.Event | None = None) -> Dequeued:
        """A long-poll goes as FINDs of at most ``LONG_POLL_SLICE_MS``, the ring free
        between them. The server answers a ring's commands in order, so one FIND waiting
        20 s held up every call of the client's other threads for those 20 s (over HTTP
        each thread has its own connection); now they wait one slice at most. And a
        ``cancelled`` call (an ``AsyncShmTransport``'s) stops within one slice, leasing
        nothing for nobody, as the HTTP server ends the long-poll of a client gone away."""
        if self._http_until and self._over_http():  # (AsyncShmTransport comes straight here)
            return self._hand_on(call)
        queue, count, lease_ms, wait_ms = call.queue, call.count, call.lease_ms, call.wait_ms
        if (
            count == 1
            and type(count) is int
            and wait_ms == 0
            and type(wait_ms) is int
            and lease_ms is None
            and not call.release
            and self._delivery_bytes < _ONE_FIND_BYTES
        ):  # the common call, one item now: one FIND of one slot, with nothing to check
            status, flags, body = self._one(queue, _FIND, _FIND_ONE_NOW, b"")
            if status != _OK:
                r = Response(status, flags, body)
                if self._refused([r]):
                    return self._hand_on(call)
                _raise(r, queue)
            return Dequeued(self._deliveries(body, flags), [], not flags & FLAG_NO_QUEUE)
        limit = self._attachment.max_batch
        _check(_RING_COUNT if limit is None else count_range(limit), count)
        _check(LEASE_MS, lease_ms)
        _check(WAIT_MS, wait_ms)
        end = time.monotonic() + wait_ms / 1000
        first, flags = self._dequeue_once(
            queue, count, lease_ms, min(wait_ms, LONG_POLL_SLICE_MS), call.release
        )
        items: list[Item] = first
        while not items and not (cancelled is not None and cancelled.is_set()):
            left = int((end - time.monotonic()) * 1000)
            if left <= 0 or flags & FLAG_DRAINING:  # the server is shutting down: stop
                break
            if self._waiting:
                self._let_waiting_go(end)
                left = int((end - time.monotonic()) * 1000)
                if left <= 0:
                    break
            items, flags = self._dequeue_once(queue, count, lease_ms, min(left, LONG_POLL_SLICE_MS))
        if items is first:
            return first
        return Dequeued(list(items), first.released, not flags & FLAG_NO_QUEUE)

    def _dequeue_once(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
    ) -> tuple[Dequeued, int]:
        """One FIND, and the flags of its answer (0 over HTTP). The releases go first,
        pipelined with it in one burst: one wake-up."""
        if self._http_until and self._over_http():
            return self._hand_on(Dequeue(queue, count, lease_ms, wait_ms, release)), 0
        timeout = self._timeout + wait_ms / 1000
        if not release:  # the common call: a FIND alone, without the releases' bookkeeping
            find = self._find_span(count, wait_ms, lease_ms, self._ring.capacity - 1)
            responses = self._run(queue, [find], timeout)
            refused = self._refused(responses)
            if refused:
                over_http = self._dequeue_over_http(
                    queue, count, lease_ms, wait_ms, release, [], responses, refused
                )
                return over_http, 0
            (r,) = responses
            if r.status != _OK:
                _raise(r, queue)
            exists = not r.flags & FLAG_NO_QUEUE
            return Dequeued(self._deliveries(r.body, r.flags), [], exists), r.flags
        _check_receipts([r.receipt for r in release])
        sendable = [r for r in release if _ascii(r.receipt)]
        commands, many = self._deletes(sendable)
        free = self._ring.capacity - 1 - sum(len(c) for c in commands)
        commands.append(self._find_span(count, wait_ms, lease_ms, free))
        responses = self._run(queue, commands, timeout)
        if many:
            responses = [*self._per_item(responses[0], len(sendable)), responses[-1]]
        refused = self._refused(responses)
        if refused:
            over_http = self._dequeue_over_http(
                queue, count, lease_ms, wait_ms, release, sendable, responses, refused
            )
            return over_http, 0
        *released, r = responses
        answers = dict(zip([id(x) for x in sendable], released, strict=True))
        outcomes = [self._outcome(queue, x.id, answers.get(id(x)), _released_ok) for x in release]
        if r.status != _OK:
            _raise(r, queue)
        exists = not r.flags & FLAG_NO_QUEUE
        return Dequeued(self._deliveries(r.body, r.flags), outcomes, exists), r.flags

    def _dequeue_over_http(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release],
        sendable: Sequence[Release],
        responses: Sequence[Response],
        refused: Sequence[int],
    ) -> Dequeued:
        """The follower refused part of a dequeue: the refused releases, and the FIND if
        it was refused, go over HTTP; each release keeps one outcome, in order."""
        *released, find = responses
        resend = [sendable[i] for i in refused if i < len(sendable)]
        if find.status in _FOLLOWER:
            got = self._hand_on(Dequeue(queue, count, lease_ms, wait_ms, resend))
            items, again, exists = list(got), got.released, got.queue_exists
        else:
            if find.status != _OK:
                _raise(find, queue)
            items = self._deliveries(find.body, find.flags)
            again = self._hand_on(ReleaseMany(queue, resend)) if resend else []
            exists = not find.flags & FLAG_NO_QUEUE
        by_release = dict(zip([id(x) for x in resend], again, strict=True))
        answers = dict(zip([id(x) for x in sendable], released, strict=True))
        outcomes = [
            by_release[id(x)]
            if id(x) in by_release
            else self._outcome(queue, x.id, answers.get(id(x)), _released_ok)
            for x in release
        ]
        return Dequeued(items, outcomes, exists)

    def _release_one(self, call: ReleaseOne) -> None:
        """The one DELETE ``_release_many`` would send, without its per-batch bookkeeping;
        the item's error raised, as ``ReleaseOne`` over HTTP raises it."""
        queue, item_id, receipt = call.queue, call.id, call.receipt
        if len(receipt) > RECEIPT.high or not receipt or not receipt.isascii():
            _check_receipts([receipt])  # too long: 422, as the server refuses it
            # not ASCII: no ring slot holds it, and no server would know it (raises)
            check_outcome(self._outcome(queue, item_id, None, _released_ok), queue)
        key = _DELETE_KEY.pack(item_id, 0)  # codec.encode_item's, without its call
        status, flags, body = self._one(queue, _DELETE, key, receipt.encode("ascii"))
        if status == _OK:
            return
        r = Response(status, flags, body)
        if self._refused([r]):
            self._hand_on(call)
            return
        check_outcome(self._outcome(queue, item_id, r, _released_ok), queue)

    def _release_many(self, call: ReleaseMany) -> list[Outcome]:
        return self._outcomes(call, None, _released_ok)

    def _requeue_many(self, call: RequeueMany) -> list[Outcome]:
        for b in call.batch:
            _check(DEADLINE, b.deadline)
            _check(DELAY_MS, b.delay_ms)
        return self._outcomes(call, _requeue_command, _requeued_ok)

    def _extend_many(self, call: ExtendMany) -> list[Outcome]:
        for b in call.batch:
            _check(LEASE_MS, b.lease_ms)
        return self._outcomes(call, _extend_command, _extended_ok)

    def _get_queue(self, call: GetQueue) -> QueueInfo:
        (r,) = self._run(call.queue, [[(Op.STATS, _ZERO_KEY, b"")]])
        if r.status != _OK:
            _raise(r, call.queue)
        return _wire.queue_from_stats(json.loads(r.body))

    def _health(self, call: Health) -> dict[str, Any]:
        """The ring answers (a CONTINUE with nothing to continue is a no-op round trip)."""
        try:
            r = self._live_ring().call(Op.CONTINUE, _ZERO_KEY, b"", self._timeout)
        except ShmError as exc:
            raise TransportError(f"{self.url}: {exc}") from exc
        if r.status not in (Status.OK, Status.NO_CONTINUATION):
            _raise(r, None)
        return {"status": "ok", "transport": "shm", "ring": self._attachment.name}

    def close(self) -> None:
        for ring, attachment in [*self._retired, (self._ring, self._attachment)]:
            ring.close()
            attachment.close()
        if self._http is not None:
            self._http.close()


Serve = Callable[[ShmTransport, Any], Any]

#: The calls the ring carries that a follower's ring refuses (writes, dequeues): within a
#: spell of HTTP calls (``ShmTransport._refused``) they go over HTTP.
_LEADER_CALLS: dict[type[Call[Any]], Serve] = {
    EnqueueOne: ShmTransport._enqueue_one,
    EnqueueMany: ShmTransport._enqueue_many,
    Dequeue: ShmTransport._dequeue,
    ReleaseOne: ShmTransport._release_one,
    ReleaseMany: ShmTransport._release_many,
    RequeueMany: ShmTransport._requeue_many,
    ExtendMany: ShmTransport._extend_many,
}
#: The calls the ring carries that any server answers, leader or not.
_ANY_SERVER_CALLS: dict[type[Call[Any]], Serve] = {
    GetQueue: ShmTransport._get_queue,
    Health: ShmTransport._health,
}


class AsyncShmTransport:
    """The same transport for ``AsyncClient``: calls run in a worker thread (the ring's
    wait releases the GIL), so the event loop never blocks on the ring."""

    def __init__(self, url: str, **options: Any) -> None:
        self._sync = ShmTransport(url, **options)

    async def call(self, call: Call[R]) -> R:
        """As ``ShmTransport.call``. A dequeue cancelled meanwhile (``asyncio.wait_for``,
        a task stopped at shutdown) stops its long-poll within one slice
        (``ShmTransport._dequeue``): run whole, the FIND went on in the worker thread
        and leased, up to ``wait_ms`` later, items nobody would receive (they came back
        only when their lease ran out)."""
        if not isinstance(call, Dequeue):
            return await asyncio.to_thread(self._sync.call, call)
        cancelled = threading.Event()
        try:
            got: Any = await asyncio.to_thread(self._sync._dequeue, call, cancelled)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        result: R = got  # a Dequeued: call is a Dequeue
        return result

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)
