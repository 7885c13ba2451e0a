"""Engine events on the broadcast ring: the message codec and the server's publisher.

Owns the event message format of docs/shm.md ("Broadcast ring", dq's messages)
and the publisher thread. The engine's ``on_event`` callback only appends to an
in-memory backlog and sets a flag (it runs under engine locks and must not block); the
publisher thread encodes the backlog and writes it to the ring, where it may wait at a
wraparound for slow subscribers (bounded by the writer's eviction). "Due" events are
derived from ``engine.next_wakeup``: one per queue each time its next wakeup passes.

Invariant kept: events reach the ring in the order the engine emitted them; nothing is
dropped unless the backlog passes ``max_backlog`` (counted in ``dropped``). A subscriber
reads from its join point on, so while nobody is subscribed an event is not kept at all:
an idle ring costs the engine's writers no wake-up of this thread.
"""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from dq.shm.broadcast_ring import BroadcastWriter
from dq.shm.errors import ProtocolError
from dq.storage.events import Event

__all__ = ["KINDS", "EventPublisher", "decode", "encode"]

log = logging.getLogger(__name__)

KINDS = {
    "enqueued": 1,
    "requeued": 2,
    "released": 3,
    "lease_expired": 4,
    "dead_lettered": 5,
    "queue_created": 6,
    "queue_deleted": 7,
    "due": 8,
}
_NAMES = {v: k for k, v in KINDS.items()}
HEAD = struct.Struct("<BBHQ")  # kind, queue-name length, id count, time (ms)
MAX_IDS = 1000  # per message: 12 + 128 + 8000 bytes at most


def encode(event: Event) -> list[bytes]:
    """One event as one or more messages (ids split in chunks of ``MAX_IDS``)."""
    kind = KINDS[event.kind]
    name = event.queue.encode("ascii")
    ids = event.ids
    chunks = [ids[i : i + MAX_IDS] for i in range(0, len(ids), MAX_IDS)] or [()]
    return [
        HEAD.pack(kind, len(name), len(chunk), event.time)
        + name
        + struct.pack(f"<{len(chunk)}Q", *chunk)
        for chunk in chunks
    ]


def decode(msg: bytes) -> Event:
    """The inverse of ``encode``; ``ProtocolError`` for anything malformed."""
    if len(msg) < HEAD.size:
        raise ProtocolError("event message too short", length=len(msg))
    kind, qlen, count, at = HEAD.unpack_from(msg)
    if kind not in _NAMES or len(msg) != HEAD.size + qlen + 8 * count:
        raise ProtocolError("malformed event message", kind=kind, length=len(msg))
    try:
        queue = msg[HEAD.size : HEAD.size + qlen].decode("ascii")
    except UnicodeDecodeError as exc:
        raise ProtocolError("event queue name is not ASCII") from exc
    ids = struct.unpack_from(f"<{count}Q", msg, HEAD.size + qlen)
    return Event(_NAMES[kind], queue, ids, at)


class EventPublisher:
    """The broadcast ring's one writer: engine events (and due events) to subscribers."""

    def __init__(
        self,
        engine: Any,
        buf: Any,
        *,
        evict_after_s: float = 10.0,
        due_check_s: float = 0.1,
        max_backlog: int = 1_000_000,
    ) -> None:
        self.engine = engine
        self._stop = threading.Event()
        self.writer = BroadcastWriter(buf, evict_after_s=evict_after_s, stopping=self._stop.is_set)
        self.due_check_s = due_check_s
        self.max_backlog = max_backlog
        self.published = 0
        self.dropped = 0
        self._backlog: deque[Event] = deque()
        self._wake = threading.Event()
        self._announced: dict[str, int] = {}
        self._unsubscribe: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="dq-broadcast", daemon=True)

    def start(self) -> EventPublisher:
        # while nobody reads the ring the engine builds no event for it
        self._unsubscribe = self.engine.on_event(self._on_event, wanted=self.writer.has_readers)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 5.0) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _on_event(self, event: Event) -> None:
        if not self.writer.has_readers():
            return
        if len(self._backlog) >= self.max_backlog:
            self.dropped += 1
            return
        self._backlog.append(event)
        self._wake.set()

    def _run(self) -> None:
        next_due = 0.0
        while not self._stop.is_set():
            self._wake.wait(self.due_check_s)
            self._wake.clear()
            try:
                self._flush()
                if time.monotonic() >= next_due and self.writer.has_readers():
                    next_due = time.monotonic() + self.due_check_s
                    self._flush(self._due_events())
            except Exception:  # keep publishing whatever one bad event did
                log.exception("broadcast publisher error")
                time.sleep(self.due_check_s)
        with contextlib.suppress(Exception):
            self._flush()

    def _flush(self, extra: list[Event] | None = None) -> None:
        backlog, messages = self._backlog, []
        events = extra if extra is not None else []
        if extra is None:
            while backlog:
                events.append(backlog.popleft())
        for event in events:
            messages.extend(encode(event))
        if messages:
            self.writer.publish(messages)
            self.published += len(events)

    def _due_events(self) -> list[Event]:
        """A "due" event per queue whose next wakeup (deadline or lease expiry) passed."""
        engine, now, out = self.engine, self.engine.now(), []
        queues = engine.list_queues()
        for queue in queues:
            try:
                wakeup = engine.next_wakeup(queue)
            except Exception:  # deleted meanwhile
                continue
            if wakeup is None or wakeup > now or self._announced.get(queue) == wakeup:
                continue
            self._announced[queue] = wakeup
            out.append(Event("due", queue, (), wakeup))
        for gone in set(self._announced) - set(queues):
            del self._announced[gone]
        return out
