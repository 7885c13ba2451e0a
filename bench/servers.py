"""What the benchmarks that start a server (``dq serve``, a peer, an etcd) share: a free
port on 127.0.0.1 for it, and stopping it. One definition for every such benchmark."""

from __future__ import annotations

import signal
import socket
import subprocess

__all__ = ["free_port", "stop"]


def free_port() -> int:
    """A TCP port no one listens on now (the kernel's pick); the server binds it next."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as an operator stops it, and SIGKILL if it has not exited 30 s later."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
