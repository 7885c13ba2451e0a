"""The shared-memory server: accepts local clients, gives each its own command ring and
serves it from a dedicated thread.

Owns the sessions' life cycle (``docs/shm.md``, "Attach" and "Command ring"). Invariants:
  - one ring per client, created at attach and unlinked when the client's socket closes
    (exit, crash, kill) or when the server drops the client or stops: no leaked objects;
  - a client that breaks the ring protocol is dropped alone; nothing it writes can raise
    out of its session thread or reach the engine unchecked (``shm/command_handler.py``);
  - commands of one ring are answered in ring order; a session waits for its own durable
    writes only, so one client's fsync never holds up another's ring;
  - idle costs nothing: session threads park on a futex, the control thread in ``select``;
  - durable commands are group-committed led by the writers (``storage/syncer.py``,
    ``Syncer.lead``, as LevelDB's ``DBImpl::Write``): a session that finds no round
    running runs it on its own thread, and the writes other sessions make meanwhile
    join the leader's next round, one per queue. (An earlier design where each session
    committed only its own writes measured 40 % fewer items a second with 4 producer and
    4 consumer sessions, one fsync per session where a shared round takes one:
    ``bench/NOTES.md``; the shared rounds are what the leader keeps.)

The HTTP lifespan (``server/lifespan.py``) builds it from the typed settings:
``ShmServer(engine, data_dir, http_url=..., max_clients=..., spin_us=...).start()`` and
``.close()``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dq.shm._session import RingSession
from dq.shm.attach import (
    PROTOCOL_VERSION,
    SHM_DIR,
    create_shm,
    peer_pid,
    peer_uid,
    read_message,
    send_message,
    shm_prefix,
    socket_path,
    unlink_shm,
)
from dq.shm.command_handler import STATUSES, CommandHandler
from dq.shm.command_ring import DEFAULT_SPIN_US, MAX_CAPACITY, SLOT_SIZE, VALUE_MAX, ring_size
from dq.shm.errors import ShmError
from dq.storage.itemops import ItemOps
from dq.storage.syncer import InlineCommits, Syncer
from dq.storage.types import check_queue_name

__all__ = ["ShmServer"]

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0


class _Refused(ShmError):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Session:
    """One attached client: its socket, its ring, its thread."""

    def __init__(self, server: ShmServer, sock: socket.socket, number: int) -> None:
        self.server = server
        self.sock = sock
        self.number = number
        self.stopping = threading.Event()
        #: wakes a long-polling FIND: set by the engine's publications and by ``stop``
        self.woken = threading.Event()
        self.name: str | None = None
        #: the ring's compiled session loop (``shm/_session.c``), once attached
        self.ring: RingSession | None = None
        self._handler: CommandHandler | None = None
        self._mm: Any = None
        self.wakes = False
        #: the client asked for its deliveries' groups (``FLAG_GROUPS``, docs/shm.md)
        self.groups = False
        self.capacity: int | None = None
        self.queue: str | None = None
        self.pid: int | None = None
        self.thread = threading.Thread(target=self._run, name=f"dq-shm-{number}", daemon=True)

    def stop(self) -> None:
        self.stopping.set()
        self.woken.set()
        if self.ring is not None:
            self.ring.stop()

    # ---- thread body ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            ring = self._handshake()
            self.server._watch(self)
            commits = self._lead_commits(ring)
            try:
                if not self.stopping.is_set():
                    ring.serve(self.wakes, self.server.spin_us)
            finally:
                if commits is not None:
                    commits.close()  # commits what it noted: no write left waiting
        except _Refused as exc:
            log.info("shm client %d refused: %s", self.number, exc.message)
            with contextlib.suppress(OSError):
                send_message(self.sock, {"ok": False, "error": exc.code, "message": exc.message})
        except ShmError as exc:
            log.warning("shm client %d dropped: %s", self.number, exc)
        except Exception:
            log.exception("shm client %d dropped after an unexpected error", self.number)
        finally:
            self._cleanup()

    def _handshake(self) -> RingSession:
        sock = self.sock
        sock.settimeout(HANDSHAKE_TIMEOUT_S)
        if peer_uid(sock) != os.getuid():
            raise _Refused("forbidden", "the shared-memory server only serves its own user")
        request = read_message(sock)
        if request.get("version") != PROTOCOL_VERSION:
            raise _Refused("unsupported_version", f"protocol version {PROTOCOL_VERSION} only")
        capacity = request.get("capacity", 64)
        if not isinstance(capacity, int) or not 2 <= capacity <= MAX_CAPACITY:
            raise _Refused("invalid_argument", f"capacity must be 2..{MAX_CAPACITY}")
        queue = request.get("queue")
        if queue is not None:
            try:
                queue = check_queue_name(queue)
            except Exception as exc:
                raise _Refused("invalid_queue_name", str(exc)) from None
        self.wakes = request.get("wakes") is True
        self.groups = request.get("groups") is True
        self.capacity, self.queue, self.pid = capacity, queue, peer_pid(sock)
        size = ring_size(capacity)
        server = self.server
        self.name, self._mm = create_shm(server.shm_prefix, size)
        handler = self._handler = CommandHandler(
            server.engine, queue, self.stopping, server.ops, self.woken
        )
        # writes the ring's header (head 0, tail 0, capacity) before the client sees it
        ring = RingSession(
            self._mm,
            capacity,
            handler,
            STATUSES,
            bound=queue is not None,
            watch=server.tail_watch,
            groups=self.groups,
        )
        self.ring = ring
        if self.stopping.is_set():  # stopped before there was a ring to wake
            ring.stop()
        send_message(
            sock,
            {
                "ok": True,
                "version": PROTOCOL_VERSION,
                "shm": self.name,
                "size": size,
                "capacity": capacity,
                "slot_size": SLOT_SIZE,
                "value_max": VALUE_MAX,
                "http_url": server.http_url,
                "max_batch": server.engine.config.max_batch,
                "groups": self.groups,
            },
        )
        sock.settimeout(None)
        return ring

    def _lead_commits(self, ring: RingSession) -> InlineCommits | None:
        """With ``fsync always``, this thread leads the group commits of its writes
        (``Syncer.commit_inline(led=True)``): the session loop runs them before it waits
        (``RingSession.later``). Made here, on the session's own thread."""
        engine = self.server.engine
        syncer: Syncer | None = getattr(engine, "syncer", None)
        if syncer is None or engine.config.fsync != "always" or self._handler is None:
            return None
        try:
            commits = syncer.commit_inline(ring.later, led=True)
        except RuntimeError:  # the engine is stopping
            return None
        self._handler.commits = commits
        return commits

    def _cleanup(self) -> None:
        self.stopping.set()
        if self.ring is not None:
            self.ring.close()  # answers still due are dropped: the client is gone
        if self._mm is not None:
            with contextlib.suppress(BufferError):
                self._mm.close()
        if self.name is not None:
            unlink_shm(self.name)
        # post before forgetting: ShmServer.close() either joins us or finds the request
        self.server._post("close", self)  # the control thread unwatches and closes it
        self.server._forget(self)


class ShmServer:
    """Serves command rings for one engine and data directory."""

    def __init__(
        self,
        engine: Any,
        data_dir: str | os.PathLike[str],
        *,
        http_url: str | None = None,
        max_clients: int = 256,
        spin_us: float = DEFAULT_SPIN_US,
        max_wait_ms: int = 20_000,
        ops: ItemOps | None = None,
    ) -> None:
        self.engine = engine
        #: the item operations, shared with the HTTP server when it runs this one (their
        #: long-poll waiters too: a shutdown ends the waits of both alike)
        self.ops = ops if ops is not None else ItemOps(engine, max_wait_ms=max_wait_ms)
        self.data_dir = Path(data_dir)
        self.http_url = http_url
        self.max_clients = max_clients
        self.spin_us = spin_us
        self.shm_prefix = shm_prefix(self.data_dir)
        self.socket_path = socket_path(self.data_dir)
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._closing = False
        self._counter = 0
        self._requests: list[tuple[str, Session]] = []
        self._watched: set[int] = set()
        #: called with a ring's new tail each time a session moves it, on the thread that
        #: moved it (a test's window into the hand-off); None in service
        self.tail_watch: Callable[[int], object] | None = None

    @property
    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def clients(self) -> list[dict[str, Any]]:
        """The attached clients (for the dashboard's server view)."""
        with self._lock:
            sessions = list(self._sessions.values())
        return [
            {
                "number": s.number,
                "pid": s.pid,
                "shm": s.name,
                "capacity": s.capacity,
                "queue": s.queue,
            }
            for s in sessions
            if s.ring is not None
        ]

    def start(self) -> ShmServer:
        self._remove_leftovers()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # bind under a private name, restrict it, then rename: never a window at 0644
        tmp = self.socket_path.with_name(f".{self.socket_path.name}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        try:
            listener.bind(str(tmp))
        except OSError as exc:
            for resource in (listener, self._wake_r, self._wake_w, self._selector):
                resource.close()
            raise ShmError(
                "cannot create the attach socket (AF_UNIX paths are limited to 107 bytes)",
                socket=str(self.socket_path),
                error=str(exc),
            ) from exc
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.socket_path)
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._selector.register(listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._control, name="dq-shm-control", daemon=True)
        self._thread.start()
        log.info("shared-memory server listening on %s", self.socket_path)
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, drop every client, unlink every ring and the socket."""
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._lock:
            sessions = list(self._sessions.values())
        for session in sessions:
            session.stop()
        for session in sessions:
            session.thread.join(timeout_s)
        with self._lock:
            requests, self._requests = self._requests, []
        for _, session in requests:
            with contextlib.suppress(OSError):
                session.sock.close()
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_path.unlink()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def __enter__(self) -> ShmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the control thread: accept, and notice clients that go away -------------------

    def _control(self) -> None:
        listener = self._listener
        assert listener is not None
        while not self._closing:
            for key, _ in self._selector.select():
                sock = key.fileobj
                if sock is listener:
                    self._accept(listener)
                elif sock is self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096)
                    self._run_requests()
                else:
                    self._client_readable(key.data)

    def _accept(self, listener: socket.socket) -> None:
        try:
            sock, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        sock.setblocking(True)
        with self._lock:
            full = len(self._sessions) >= self.max_clients
            if not full:
                self._counter += 1
                session = Session(self, sock, self._counter)
                self._sessions[session.number] = session
        if full:
            with contextlib.suppress(OSError):
                refusal = {"ok": False, "error": "too_many_clients", "message": "client limit"}
                send_message(sock, refusal)
            sock.close()
            return
        session.thread.start()

    def _watch(self, session: Session) -> None:
        """Called by a session after its handshake: from now on, EOF means it is gone."""
        self._post("watch", session)

    def _post(self, what: str, session: Session) -> None:
        # the selector is only touched by the control thread: hand the change over to it
        with self._lock:
            self._requests.append((what, session))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run_requests(self) -> None:
        with self._lock:
            requests, self._requests = self._requests, []
        for what, session in requests:
            if what == "watch" and not session.stopping.is_set():
                self._selector.register(session.sock, selectors.EVENT_READ, session)
                self._watched.add(session.number)
            elif what == "close":
                if session.number in self._watched:
                    self._watched.discard(session.number)
                    self._selector.unregister(session.sock)
                session.sock.close()

    def _client_readable(self, session: Session) -> None:
        """A client socket is readable: EOF (gone) or bytes it should not send; drop it."""
        if session.number in self._watched:  # stop select() reporting it again
            self._watched.discard(session.number)
            self._selector.unregister(session.sock)
        session.stop()

    def _forget(self, session: Session) -> None:
        with self._lock:
            self._sessions.pop(session.number, None)

    def _remove_leftovers(self) -> None:
        """Unlink rings a crashed earlier server of this data directory left behind."""
        with contextlib.suppress(OSError):
            for path in SHM_DIR.glob(f"{self.shm_prefix}*"):
                log.info("removing leftover ring %s", path.name)
                unlink_shm(path.name)
