"""The shared-memory transport: ``Client("shm:///path/to/data-dir")``.

Speaks the command ring of ``docs/shm.md`` to a server on the same host and gives the same
API as the HTTP transport. Invariants kept:
  - the same answers and errors as over HTTP: ring status codes become the same
    ``ClientError`` classes, per-item release/requeue/extend problems the same ``Outcome``s;
  - a batch is one command: PUT_MANY / DELETE_MANY, their body spread over PART slots,
    answered in the same slots (one engine call, one wake-up each way); a dequeue of
    many sends empty PARTs before its FIND so that the answer has room; single items
    keep the one-slot PUT / DELETE / FIND;
  - what a ring cannot carry goes over HTTP (the URL comes from the attach handshake),
    transparently: an enqueue batch too big for one command (more than ``capacity - 1``
    slots; sent whole, so it keeps its all-or-nothing validation and id order), and
    queue administration;
  - one ring per transport, used under its lock; commands are pipelined (up to
    ``capacity - 1`` slots in flight) so their durable writes share a group commit;
  - on a follower of a replicated deployment the ring refuses writes and dequeues
    (``not_leader``, body: the leader's URL; ``no_leader``) before doing anything: the
    refused commands are sent again over HTTP, which follows the leader, and so is every
    call for ``HTTP_SPELL_S``; then the ring is tried again (the local server may lead).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

from dq.client import _wire
from dq.client.errors import ClientError, TransportError, error_for
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    Item,
    ItemStats,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    RedriveResult,
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
_DELIVERY_GUESS = 330  # bytes per delivery in a FIND answer before one was seen
Command = tuple[int, bytes, bytes]
Span = list[Command]  # one command: its PART slots, then the op's own slot
_RELEASED = Response(Status.OK, 0, b"")
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


def _check_item(item: NewItem) -> None:
    """The checks the server applies to a whole batch before writing any of it, in its
    words (``storage/validation.py``)."""
    if item.deadline is not None and item.delay_ms is not None:
        raise error_for(422, "validation_error", NOT_BOTH)
    _check(DEADLINE, item.deadline)
    _check(DELAY_MS, item.delay_ms)


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
        self._http: Any = None
        self._http_until = 0.0  # calls go over HTTP until then (the ring said: not the leader)
        self._bound: str | None = None
        self._generation = _generation
        self._delivery_bytes = _DELIVERY_GUESS  # the last FIND answer's, per delivery

    # ---- plumbing ------------------------------------------------------------------------

    def _attach(self) -> tuple[Attachment, ClientRing]:
        try:
            attachment = attach(self.data_dir, capacity=self._capacity, timeout_s=self._timeout)
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

    def _http_transport(self) -> Any:
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

    def _run(
        self, queue: str, commands: Sequence[Span], timeout: float | None = None
    ) -> list[Response]:
        """Send ``commands`` (each one or more slots) to ``queue`` pipelined; one joined
        response per command, in order."""
        ring = self._live_ring()
        timeout = self._timeout if timeout is None else timeout
        if self._generation != _generation:
            # a forked child shares the ring with its parent: two producers would collide
            raise TransportError(f"{self.url}: a shm client cannot cross fork(); open a new one")
        if not commands:
            return []
        try:
            with ring.lock:
                if self._bound != queue:
                    bound = ring.call_locked(_BIND, _ZERO_KEY, queue.encode(), timeout)
                    if bound.status != _OK:
                        _raise(bound, queue)
                    self._bound = queue
                if len(commands) == 1 and len(commands[0]) == 1:
                    return [ring.call_locked(*commands[0][0], timeout)]
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
        self,
        queue: str,
        ids: Sequence[int],
        receipts: Sequence[str],
        commands: Callable[[int], Command],
        ok: Callable[[int, bytes], Outcome],
        over_http: Callable[[list[int]], list[Outcome]],
        releases: Sequence[Release] | None = None,
    ) -> list[Outcome]:
        """One outcome per item; ``over_http(indexes)``: those items' outcomes over HTTP.
        ``releases``: the items are releases (sent as one DELETE_MANY)."""
        if self._over_http():
            return over_http(list(range(len(ids))))
        _check_receipts(receipts)
        sendable = [i for i, r in enumerate(receipts) if _ascii(r)]
        if releases is not None:
            spans, many = self._deletes([releases[i] for i in sendable])
            answers = self._run(queue, spans)
            if many:
                answers = self._per_item(answers[0], len(sendable))
        else:
            answers = self._run(queue, [[commands(i)] for i in sendable])
        refused = [sendable[i] for i in self._refused(answers)]
        again = dict(zip(refused, over_http(refused), strict=True)) if refused else {}
        responses = dict(zip(sendable, answers, strict=True))
        return [
            again[i] if i in again else self._outcome(queue, item_id, responses.get(i), ok)
            for i, item_id in enumerate(ids)
        ]

    @staticmethod
    def _outcome(
        queue: str, item_id: int, r: Response | None, ok: Callable[[int, bytes], Outcome]
    ) -> Outcome:
        """One item's outcome; ``None``: its receipt could not be sent (not ASCII)."""
        if r is None:
            return Outcome(item_id, False, "invalid_receipt", "receipt is not ASCII")
        if r.status == _OK:
            return ok(item_id, r.body)
        if _code(r.status) in _ITEM_ERRORS:
            return Outcome(item_id, False, _code(r.status), r.body.decode("utf-8", "replace"))
        _raise(r, queue, item_id)

    # ---- the Transport protocol ---------------------------------------------------------------

    def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]:
        """One item: a PUT; a batch (or an item with a key or a value over a slot): one
        PUT_MANY. What does not fit one command, or is refused by a follower, goes over
        HTTP whole, and so does a batch with a deadline of 0, which a ring field cannot
        tell from "not given" (an item due at the epoch sorts first; one due now, last)."""
        span = None if self._over_http() or not items else self._put_span(items)
        if span is None:
            result: list[Enqueued] = self._http_transport().enqueue(queue, items)
            return result
        (r,) = self._run(queue, [span])
        if self._refused([r]):
            again: list[Enqueued] = self._http_transport().enqueue(queue, items)
            return again
        if r.status != _OK:
            _raise(r, queue)
        if span[-1][0] == _PUT:
            return [Enqueued(*codec.decode_put_ok(r.body))]
        return [Enqueued(*done) for done in codec.decode_put_many_ok(r.body, len(items))]

    def _put_span(self, items: Sequence[NewItem]) -> Span | None:
        for item in items:
            _check_item(item)
            if item.deadline == 0:  # "not given" (now) on the ring; the epoch over HTTP
                return None
        one = items[0]
        if len(items) == 1 and one.key is None and len(one.value) <= VALUE_MAX:
            return [(_PUT, codec.encode_put(one.deadline, one.delay_ms), one.value)]
        try:
            key, body = codec.encode_put_many(
                [(i.value, i.deadline, i.delay_ms, i.key) for i in items]
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

    def _deliveries(self, body: bytes) -> list[Item]:
        got = [
            Item(i, receipt, value, dl, ItemStats(enq, req, dq), exp)
            for i, receipt, value, dl, enq, req, dq, exp in codec.delivery_fields(body)
        ]
        if got:
            self._delivery_bytes = max(64, (len(body) - 4) // len(got) + 1)
        return got

    def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
        *,
        cancelled: threading.Event | None = None,
    ) -> Dequeued:
        """A long-poll goes as FINDs of at most ``LONG_POLL_SLICE_MS``, the ring free
        between them. The server answers a ring's commands in order, so one FIND waiting
        20 s held up every call of the client's other threads for those 20 s (over HTTP
        each thread has its own connection); now they wait one slice at most. And a
        ``cancelled`` call (an ``AsyncShmTransport``'s) stops within one slice, leasing
        nothing for nobody, as the HTTP server ends the long-poll of a client gone away."""
        if self._over_http():
            got: Dequeued = self._http_transport().dequeue(queue, count, lease_ms, wait_ms, release)
            return got
        limit = self._attachment.max_batch
        _check(_RING_COUNT if limit is None else count_range(limit), count)
        _check(LEASE_MS, lease_ms)
        _check(WAIT_MS, wait_ms)
        end = time.monotonic() + wait_ms / 1000
        first, flags = self._dequeue_once(
            queue, count, lease_ms, min(wait_ms, LONG_POLL_SLICE_MS), release
        )
        items: list[Item] = first
        while not items and not (cancelled is not None and cancelled.is_set()):
            left = int((end - time.monotonic()) * 1000)
            if left <= 0 or flags & FLAG_DRAINING:  # the server is shutting down: stop
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
        if self._over_http():
            got: Dequeued = self._http_transport().dequeue(queue, count, lease_ms, wait_ms, release)
            return got, 0
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
            return Dequeued(self._deliveries(r.body), [], exists), r.flags
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
        return Dequeued(self._deliveries(r.body), outcomes, exists), r.flags

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
        http = self._http_transport()
        *released, find = responses
        resend = [sendable[i] for i in refused if i < len(sendable)]
        if find.status in _FOLLOWER:
            got: Dequeued = http.dequeue(queue, count, lease_ms, wait_ms, resend)
            items, again, exists = list(got), got.released, got.queue_exists
        else:
            if find.status != _OK:
                _raise(find, queue)
            items = self._deliveries(find.body)
            again = http.release(queue, resend) if resend else []
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

    def release_one(self, queue: str, item_id: int, receipt: str) -> Outcome | None:
        """``Client.release``'s call: ``None`` once released, else the failed outcome; the
        one DELETE ``release`` would send, without its per-batch bookkeeping."""
        if self._over_http() or not _ascii(receipt) or len(receipt) > RECEIPT.high:
            outcome = self.release(queue, [Release(item_id, receipt)])[0]
            return None if outcome.ok else outcome
        command: Command = (_DELETE, *codec.encode_item(item_id, receipt))
        (r,) = self._run(queue, [[command]])
        if r.status == _OK:
            return None
        if self._refused([r]):
            again: Outcome = self._http_transport().release(queue, [Release(item_id, receipt)])[0]
            return None if again.ok else again
        return self._outcome(queue, item_id, r, _released_ok)

    def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]:
        def command(i: int) -> Command:
            return (Op.DELETE, *codec.encode_item(batch[i].id, batch[i].receipt))

        def over_http(indexes: list[int]) -> list[Outcome]:
            got: list[Outcome] = self._http_transport().release(queue, [batch[i] for i in indexes])
            return got

        return self._outcomes(
            queue,
            [b.id for b in batch],
            [b.receipt for b in batch],
            command,
            _released_ok,
            over_http,
            releases=batch,
        )

    def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]:
        for b in batch:
            _check(DEADLINE, b.deadline)
            _check(DELAY_MS, b.delay_ms)

        def command(i: int) -> Command:
            b = batch[i]
            return (Op.REQUEUE, *codec.encode_requeue(b.id, b.receipt, b.deadline, b.delay_ms))

        def over_http(indexes: list[int]) -> list[Outcome]:
            got: list[Outcome] = self._http_transport().requeue(queue, [batch[i] for i in indexes])
            return got

        return self._outcomes(
            queue,
            [b.id for b in batch],
            [b.receipt for b in batch],
            command,
            lambda item_id, body: Outcome(item_id, True, deadline=codec.decode_u64(body)),
            over_http,
        )

    def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]:
        for b in batch:
            _check(LEASE_MS, b.lease_ms)

        def command(i: int) -> Command:
            b = batch[i]
            return (Op.EXTEND, *codec.encode_extend(b.id, b.receipt, b.lease_ms))

        def ok(item_id: int, body: bytes) -> Outcome:
            expires, receipt = codec.decode_extend_ok(body)
            return Outcome(item_id, True, receipt=receipt, lease_expires=expires)

        def over_http(indexes: list[int]) -> list[Outcome]:
            got: list[Outcome] = self._http_transport().extend(queue, [batch[i] for i in indexes])
            return got

        ids, receipts = [b.id for b in batch], [b.receipt for b in batch]
        return self._outcomes(queue, ids, receipts, command, ok, over_http)

    def get_queue(self, queue: str) -> QueueInfo:
        (r,) = self._run(queue, [[(Op.STATS, _ZERO_KEY, b"")]])
        if r.status != _OK:
            _raise(r, queue)
        return _wire.queue_from_stats(json.loads(r.body))

    def list_queues(self) -> list[QueueInfo]:
        result: list[QueueInfo] = self._http_transport().list_queues()
        return result

    def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo:
        result: QueueInfo = self._http_transport().put_queue(queue, config)
        return result

    def delete_queue(self, queue: str, force: bool = False) -> None:
        self._http_transport().delete_queue(queue, force)

    def health(self) -> dict[str, Any]:
        """The ring answers (a CONTINUE with nothing to continue is a no-op round trip)."""
        try:
            r = self._live_ring().call(Op.CONTINUE, _ZERO_KEY, b"", self._timeout)
        except ShmError as exc:
            raise TransportError(f"{self.url}: {exc}") from exc
        if r.status not in (Status.OK, Status.NO_CONTINUATION):
            _raise(r, None)
        return {"status": "ok", "transport": "shm", "ring": self._attachment.name}

    # operator calls go over HTTP (the ring carries the hot path only)
    def pause(self, queue: str, resume: bool = False) -> QueueInfo:
        result: QueueInfo = self._http_transport().pause(queue, resume)
        return result

    def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage:
        result: BrowsePage = self._http_transport().browse(queue, state, after, limit, values)
        return result

    def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem:
        result: BrowsedItem = self._http_transport().peek(queue, item_id, values)
        return result

    def purge(self, queue: str) -> int:
        return int(self._http_transport().purge(queue))

    def delete_item(self, queue: str, item_id: int) -> None:
        self._http_transport().delete_item(queue, item_id)

    def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult:
        result: RedriveResult = self._http_transport().redrive(queue, to, ids, limit)
        return result

    def backup(self, dest: str) -> BackupResult:
        result: BackupResult = self._http_transport().backup(dest)
        return result

    def close(self) -> None:
        for ring, attachment in [*self._retired, (self._ring, self._attachment)]:
            ring.close()
            attachment.close()
        if self._http is not None:
            self._http.close()


class AsyncShmTransport:
    """The same transport for ``AsyncClient``: ring calls run in a worker thread (the wait
    itself releases the GIL), so the event loop never blocks on the ring."""

    def __init__(self, url: str, **options: Any) -> None:
        self._sync = ShmTransport(url, **options)

    async def enqueue(self, queue: str, items: Sequence[NewItem]) -> list[Enqueued]:
        return await asyncio.to_thread(self._sync.enqueue, queue, items)

    async def dequeue(
        self,
        queue: str,
        count: int,
        lease_ms: int | None,
        wait_ms: int,
        release: Sequence[Release] = (),
    ) -> Dequeued:
        """A call cancelled meanwhile (``asyncio.wait_for``, a task stopped at shutdown)
        stops its long-poll within one slice (``ShmTransport.dequeue``): run whole, the
        FIND went on in the worker thread and leased, up to ``wait_ms`` later, items
        nobody would receive (they came back only when their lease ran out)."""
        cancelled = threading.Event()
        poll = partial(
            self._sync.dequeue, queue, count, lease_ms, wait_ms, release, cancelled=cancelled
        )
        try:
            return await asyncio.to_thread(poll)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def release(self, queue: str, batch: Sequence[Release]) -> list[Outcome]:
        return await asyncio.to_thread(self._sync.release, queue, batch)

    async def requeue(self, queue: str, batch: Sequence[Requeue]) -> list[Outcome]:
        return await asyncio.to_thread(self._sync.requeue, queue, batch)

    async def extend(self, queue: str, batch: Sequence[Extend]) -> list[Outcome]:
        return await asyncio.to_thread(self._sync.extend, queue, batch)

    async def list_queues(self) -> list[QueueInfo]:
        return await asyncio.to_thread(self._sync.list_queues)

    async def get_queue(self, queue: str) -> QueueInfo:
        return await asyncio.to_thread(self._sync.get_queue, queue)

    async def put_queue(self, queue: str, config: QueueConfig) -> QueueInfo:
        return await asyncio.to_thread(self._sync.put_queue, queue, config)

    async def delete_queue(self, queue: str, force: bool = False) -> None:
        await asyncio.to_thread(self._sync.delete_queue, queue, force)

    async def health(self) -> dict[str, Any]:
        return await asyncio.to_thread(self._sync.health)

    async def pause(self, queue: str, resume: bool = False) -> QueueInfo:
        return await asyncio.to_thread(self._sync.pause, queue, resume)

    async def browse(
        self, queue: str, state: str, after: str | None, limit: int, values: bool
    ) -> BrowsePage:
        return await asyncio.to_thread(self._sync.browse, queue, state, after, limit, values)

    async def peek(self, queue: str, item_id: int, values: bool) -> BrowsedItem:
        return await asyncio.to_thread(self._sync.peek, queue, item_id, values)

    async def purge(self, queue: str) -> int:
        return await asyncio.to_thread(self._sync.purge, queue)

    async def delete_item(self, queue: str, item_id: int) -> None:
        await asyncio.to_thread(self._sync.delete_item, queue, item_id)

    async def redrive(
        self, queue: str, to: str | None, ids: Sequence[int] | None, limit: int | None
    ) -> RedriveResult:
        return await asyncio.to_thread(self._sync.redrive, queue, to, ids, limit)

    async def backup(self, dest: str) -> BackupResult:
        return await asyncio.to_thread(self._sync.backup, dest)

    async def close(self) -> None:
        await asyncio.to_thread(self._sync.close)
