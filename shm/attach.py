"""Attach: how a local client finds the server and gets its own command ring.

Owns the Unix-socket handshake of ``docs/shm.md`` ("Attach") and the POSIX shared-memory
objects behind the rings. Invariants kept:
  - the socket lives in the data directory as ``dq.sock``, mode 0600, and the server
    serves only peers whose uid (``SO_PEERCRED``) is its own;
  - shared-memory objects are created exclusively (``O_EXCL``), mode 0600, named
    ``/dq-<data-dir tag>-<pid>-<n>-<random>``, so a server can find and remove leftovers
    of an earlier crash of the same data directory, and of nothing else;
  - the connection stays open for the ring's whole life: its end (close, exit, crash)
    is how the server learns the client is gone.

The handshake is one JSON line each way (UTF-8, at most 4 KiB):

    client → {"version": 1, "queue": "jobs" | null, "capacity": 64, "wakes": true,
              "groups": true}
    server → {"ok": true, "version": 1, "shm": "/dq-…", "size": 133144, "capacity": 64,
              "slot_size": 2080, "value_max": 1024, "http_url": "http://…" | null,
              "max_batch": 1000, "groups": true}

``groups``: the client reads each delivery's group (``FLAG_GROUPS``); a server that says
nothing of it sends none, and a client that does not ask gets none (an older client's
decoding of a FIND answer stays as it was).
          or {"ok": false, "error": "code", "message": "…"}
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import secrets
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dq.shm.errors import AttachError

__all__ = [
    "PROTOCOL_VERSION",
    "SHM_DIR",
    "SOCKET_NAME",
    "Attachment",
    "attach",
    "create_shm",
    "data_dir_tag",
    "open_shm",
    "peer_pid",
    "peer_uid",
    "read_message",
    "send_message",
    "shm_prefix",
    "socket_path",
    "unlink_shm",
]

PROTOCOL_VERSION = 1
SOCKET_NAME = "dq.sock"
SHM_DIR = Path("/dev/shm")  # where Linux keeps POSIX shared-memory objects
MAX_MESSAGE = 4096
UCRED = struct.Struct("3i")  # pid, uid, gid


def socket_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / SOCKET_NAME


def data_dir_tag(data_dir: str | os.PathLike[str]) -> str:
    """A short stable tag of the data directory, part of every ring name it owns."""
    return hashlib.sha256(str(Path(data_dir).resolve()).encode()).hexdigest()[:12]


def shm_prefix(data_dir: str | os.PathLike[str]) -> str:
    return f"dq-{data_dir_tag(data_dir)}-"


# ---- shared-memory objects -------------------------------------------------------------


def _shm_file(name: str) -> Path:
    bare = name.removeprefix("/")
    if not bare or "/" in bare or bare in {".", ".."}:
        raise AttachError("bad shared-memory name", name=name)
    return SHM_DIR / bare


def create_shm(prefix: str, size: int) -> tuple[str, mmap.mmap]:
    """Create a fresh object ``/<prefix><pid>-<random>`` of ``size`` zero bytes, mode 0600."""
    name = f"/{prefix}{os.getpid()}-{secrets.token_hex(6)}"
    fd = os.open(_shm_file(name), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, size)
        return name, mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.unlink(_shm_file(name))
        raise
    finally:
        os.close(fd)


def open_shm(name: str, size: int) -> mmap.mmap:
    """Map an existing object by the name the server handed over."""
    try:
        fd = os.open(_shm_file(name), os.O_RDWR | os.O_NOFOLLOW)
    except OSError as exc:
        raise AttachError("cannot open the ring", name=name, error=str(exc)) from exc
    try:
        if os.fstat(fd).st_size < size:
            raise AttachError("ring smaller than announced", name=name, size=size)
        return mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def unlink_shm(name: str) -> bool:
    """Remove the object; False if it was already gone."""
    try:
        os.unlink(_shm_file(name))
    except FileNotFoundError:
        return False
    return True


# ---- socket messages -------------------------------------------------------------------


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process at the other end (Linux ``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    return int(UCRED.unpack(raw)[0])


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end (Linux ``SO_PEERCRED``)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, UCRED.size)
    return int(UCRED.unpack(raw)[1])


def send_message(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def read_message(sock: socket.socket) -> dict[str, Any]:
    """Read one JSON line (the socket's timeout applies); AttachError if malformed."""
    buf = b""
    while not buf.endswith(b"\n"):
        if len(buf) > MAX_MESSAGE:
            raise AttachError("handshake message too long")
        try:
            chunk = sock.recv(MAX_MESSAGE)
        except OSError as exc:
            raise AttachError("handshake failed", error=str(exc)) from exc
        if not chunk:
            raise AttachError("connection closed during the handshake")
        buf += chunk
    try:
        message = json.loads(buf)
    except ValueError:
        raise AttachError("handshake message is not JSON") from None
    if not isinstance(message, dict):
        raise AttachError("handshake message is not a JSON object")
    return message


# ---- the client side -----------------------------------------------------------------------


@dataclass(slots=True)
class Attachment:
    """A live attachment: keep ``sock`` open as long as ``mm`` is in use."""

    sock: socket.socket
    mm: mmap.mmap
    name: str
    capacity: int
    http_url: str | None
    #: the server's batch limit (``DQ_MAX_BATCH``), which bounds a dequeue's count; None
    #: from a server that does not say
    max_batch: int | None = None

    def close(self) -> None:
        with contextlib.suppress(BufferError):
            self.mm.close()
        self.sock.close()

    def server_gone(self) -> bool:
        """Whether the server closed its end of the socket (it stopped, crashed or dropped
        this client): after the handshake it never writes, so a readable socket is EOF."""
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:  # nothing to read: the connection is open
            return False
        except OSError:  # reset, or closed on this side
            return True


def attach(
    data_dir: str | os.PathLike[str],
    *,
    queue: str | None = None,
    capacity: int = 64,
    timeout_s: float = 10.0,
    groups: bool = False,
) -> Attachment:
    """Connect to the server of ``data_dir`` and map the ring it creates for us;
    ``groups``: ask for the deliveries' groups (each FIND answer says whether they came)."""
    path = socket_path(data_dir)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except OSError as exc:
            raise AttachError("no shared-memory server", socket=str(path), error=str(exc)) from exc
        send_message(
            sock,
            {
                "version": PROTOCOL_VERSION,
                "queue": queue,
                "capacity": capacity,
                "wakes": True,
                "groups": groups,
            },
        )
        reply = read_message(sock)
        if not reply.get("ok"):
            raise AttachError(str(reply.get("message", "attach refused")), error=reply.get("error"))
        name, size, cap = reply.get("shm"), reply.get("size"), reply.get("capacity")
        if not isinstance(name, str) or not isinstance(size, int) or not isinstance(cap, int):
            raise AttachError("malformed attach reply", reply=reply)
        mm = open_shm(name, size)
        sock.settimeout(None)
        url = reply.get("http_url")
        limit = reply.get("max_batch")
        return Attachment(
            sock,
            mm,
            name,
            cap,
            url if isinstance(url, str) else None,
            limit if isinstance(limit, int) and not isinstance(limit, bool) else None,
        )
    except BaseException:
        sock.close()
        raise
