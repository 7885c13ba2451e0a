"""A free TCP port on 127.0.0.1, for a server a benchmark starts (``dq serve``, a peer,
an etcd): the kernel picks one no one listens on; the server binds it a moment later.
One definition for every benchmark that starts a server."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
