"""A scripted HTTP/1.1 server on 127.0.0.1 for the transport's retry and error tests.

It answers each request it reads with the next entry of its script: an answer
(status and JSON document), ``DROP`` (close the connection without answering: the
answer is lost) or ``CLOSE_AFTER`` an answer (answer, then close the connection
without saying so, as a server whose keep-alive timeout ran out) or ``HANG`` (never
answer, until the client gives up). The last entry repeats. Every request is recorded in ``seen`` as ``(method, path, body)``.

``GET /v1/cluster`` (the client's question "who leads?" to a node it has not heard from
since its last lost answer) is answered apart from the script, with ``view`` (404 while
it is ``None``, as a server without that route), and counted in ``probes``, not in
``seen``. With ``stalled`` set the server answers nothing at all (it still records what
it was sent), probes included, as a process stopped by ``SIGSTOP`` whose kernel still
accepts the connection.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["DROP", "HANG", "Answer", "ScriptedServer", "scripted"]

DROP = "drop"
HANG = "hang"


@dataclass(frozen=True)
class Answer:
    status: int
    doc: Any = None
    close_after: bool = False
    chunked: bool = False

    def encode(self) -> bytes:
        body = b"" if self.doc is None else json.dumps(self.doc).encode()
        head = f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\n"
        if self.chunked:
            chunks = b"".join(
                b"%x\r\n%s\r\n" % (len(body[i : i + 7]), body[i : i + 7])
                for i in range(0, len(body), 7)
            )
            return (head + "transfer-encoding: chunked\r\n\r\n").encode() + chunks + b"0\r\n\r\n"
        return (head + f"content-length: {len(body)}\r\n\r\n").encode() + body


class ScriptedServer:
    def __init__(self, script: list[Answer | str]) -> None:
        self.script = script
        self.seen: list[tuple[str, str, bytes]] = []
        #: the answer to ``GET /v1/cluster`` (None: 404)
        self.view: dict[str, Any] | None = None
        self.probes = 0
        self.stalled = False
        self.connections = 0
        #: connections this server has closed so far
        self.closed = 0
        self._closed_lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            with self._closed_lock:
                self.closed += 1

    def wait_closed(self, count: int, timeout: float = 5.0) -> None:
        """Until this server has closed ``count`` connections (its closing races the
        client otherwise)."""
        give_up = time.monotonic() + timeout
        while self.closed < count:
            assert time.monotonic() < give_up, f"{self.closed} of {count} connections closed"
            time.sleep(0.005)

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        reader = conn.makefile("rb")
        with contextlib.suppress(OSError), conn, reader:
            while True:
                line = reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.decode().partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                body = reader.read(length)
                probe = (method, path) == ("GET", "/v1/cluster")
                if probe:
                    self.probes += 1
                else:
                    self.seen.append((method, path, body))
                if self.stalled:
                    reader.read(1)  # returns when the client closes (or after 10 s)
                    return
                if probe:
                    view = self.view
                    conn.sendall(
                        Answer(404, {"error": "not_found"}).encode()
                        if view is None
                        else Answer(200, view).encode()
                    )
                    continue
                step = self.script[min(len(self.seen), len(self.script)) - 1]
                if step == DROP:
                    return
                if step == HANG:
                    reader.read(1)  # returns when the client closes (or after 10 s)
                    return
                assert isinstance(step, Answer)
                conn.sendall(step.encode())
                if step.close_after:
                    return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()


@contextlib.contextmanager
def scripted(*script: Answer | str) -> Iterator[ScriptedServer]:
    server = ScriptedServer(list(script))
    try:
        yield server
    finally:
        server.close()
