"""A scripted stand-in for a leader's replica routes, for the follower's unit tests.

It speaks the wire of docs/replication.md (``POST /v1/replica/pull``, ``POST
/v1/replica/snapshot``) over a real socket on 127.0.0.1, serving frames from a list and
a snapshot built from a dict, and records every request. Tests script its answers:
``refuse`` queues error answers for the next pulls, ``corrupt_next`` damages the next
answer's bytes. The real leader is tested against the real follower elsewhere.
"""

from __future__ import annotations

import io
import json
import ssl
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dq.server.errors import error_json
from dq.storage.replication import Frame, encode_frame

__all__ = ["FakeLeader", "Request"]


@dataclass
class Request:
    path: str
    body: dict[str, Any]
    authorization: str | None
    #: the client's (host, port): one port for many requests is one kept-alive connection
    peer: tuple[str, int] = ("", 0)
    at: float = field(default_factory=time.monotonic)


def snapshot_tar(
    epoch: int, lsn: int, queues: dict[str, dict[str, bytes]], lsns: dict[str, int]
) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:

        def add(name: str, data: bytes | None) -> None:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        add("snapshot.json", json.dumps({"epoch": epoch, "lsn": lsn, "queues": lsns}).encode())
        add("queues", None)
        for queue, files in sorted(queues.items()):
            add(f"queues/{queue}", None)
            for name, data in sorted(files.items()):
                add(f"queues/{queue}/{name}", data)
    return out.getvalue()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a follower that stops drops its connection mid-answer: expected here


class FakeLeader:
    def __init__(self, epoch: int, tls: tuple[str, str] | None = None) -> None:
        self.epoch = epoch
        self.frames: list[Frame] = []
        self.snapshot_lsn = 0
        self.snapshot_queues: dict[str, dict[str, bytes]] = {}
        self.snapshot_lsns: dict[str, int] = {}
        #: overrides the epoch written into snapshot.json
        self.snapshot_epoch: int | None = None
        self.requests: list[Request] = []
        #: (status, code) answers for the next pulls, first first
        self.refusals: list[tuple[int, str]] = []
        self.corrupt_next = False
        #: a snapshot answer stops this long half-way through its body
        self.snapshot_stall_s = 0.0
        #: how long a pull with nothing new is held (capped by its wait_ms)
        self.hold_s = 0.05
        #: called with each request before it is answered (e.g. to look at the disk)
        self.on_request: Callable[[Request], None] = lambda r: None
        self.cond = threading.Condition()
        self._server = _Server(("127.0.0.1", 0), self._handler())
        scheme = "http"
        if tls is not None:  # (certificate, key) PEM files: serve HTTPS
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> FakeLeader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def add(self, *frames: Frame) -> None:
        with self.cond:
            self.frames.extend(frames)
            self.cond.notify_all()

    def pulls(self) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.path.endswith("/pull")]

    def snapshots(self) -> list[Request]:
        with self.cond:
            return [r for r in self.requests if r.path.endswith("/snapshot")]

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        give_up = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > give_up:
                raise AssertionError(f"timed out; requests: {self.requests}")
            time.sleep(0.01)

    def _answer_pull(self, body: dict[str, Any]) -> tuple[int, dict[str, str], bytes]:
        with self.cond:
            after = int(body["after"])
            wait_s = min(self.hold_s, int(body.get("wait_ms", 0)) / 1000.0)
            self.cond.wait_for(
                lambda: self.refusals or any(f.lsn > after for f in self.frames), timeout=wait_s
            )
            if self.refusals:  # looked at last: a held pull gets what was scripted meanwhile
                status, code = self.refusals.pop(0)
                error = error_json(code, "scripted")  # the bytes the server sends
                return status, {"Content-Type": "application/json"}, error
            data = b"".join(encode_frame(f) for f in self.frames if f.lsn > after)
            if self.corrupt_next and data:
                self.corrupt_next = False
                damaged = bytearray(data)
                damaged[-1] ^= 0xFF
                data = bytes(damaged)
            last = max((f.lsn for f in self.frames), default=self.snapshot_lsn)
            headers = {"X-DQ-Epoch": str(self.epoch), "X-DQ-Commit": str(last)}
            return 200, headers, data

    def _answer_snapshot(self) -> tuple[int, dict[str, str], bytes]:
        with self.cond:
            epoch = self.epoch if self.snapshot_epoch is None else self.snapshot_epoch
            data = snapshot_tar(epoch, self.snapshot_lsn, self.snapshot_queues, self.snapshot_lsns)
        return 200, {"Content-Type": "application/x-tar"}, data

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        leader = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                peer = (str(self.client_address[0]), int(self.client_address[1]))
                request = Request(self.path, body, self.headers.get("Authorization"), peer)
                with leader.cond:
                    leader.requests.append(request)
                leader.on_request(request)
                if self.path == "/v1/replica/pull":
                    status, headers, data = leader._answer_pull(body)
                elif self.path == "/v1/replica/snapshot":
                    status, headers, data = leader._answer_snapshot()
                else:
                    status, headers, data = 404, {}, b""
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.path.endswith("/snapshot") and leader.snapshot_stall_s:
                    half = len(data) // 2
                    self.wfile.write(data[:half])
                    self.wfile.flush()
                    time.sleep(leader.snapshot_stall_s)
                    data = data[half:]
                self.wfile.write(data)

        return Handler
