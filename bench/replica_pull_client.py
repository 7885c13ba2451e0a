"""A follower's CPU per pull request: ``LeaderClient.pull`` beside ``http.client``.

Run from the repository root:

    .venv/bin/python -m bench.replica_pull_client [--pulls 3000] [--runs 3]

A follower sends one pull per round trip, and the round trip is on the path of every
replicated write's acknowledgement, so the client's CPU per pull matters on a machine
the members share. A thread of this process answers every request at once with the same
canned 200 (320 bytes of frames, the leader's headers) over one kept-alive connection on
127.0.0.1; the figure is the client thread's CPU time per pull (``time.thread_time``)
for ``LeaderClient.pull`` (its own HTTP/1.1 handling) and for the same request through
``http.client`` (what it used before). It prints a table; ``bench/NOTES.md``
("Replication: a follower's pull request") has the runs with the machine and its load,
``docs/performance.md`` ("Replication") the current figure.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from dq.server.replication.leader_client import LeaderClient

_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\nx-dq-epoch: 1\r\n"
    b"x-dq-commit: 5\r\nx-dq-lsn: 5\r\ncontent-length: 320\r\n\r\n" + b"f" * 320
)


def _serve(listener: socket.socket) -> None:
    """Answer every request on every connection at once with the canned 200."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=_answer, args=(conn,), daemon=True).start()


def _answer(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    with conn:
        while data := conn.recv(65536):
            buf += data
            while b"\r\n\r\n" in buf:
                head, _, rest = buf.partition(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                if len(rest) < length:
                    break
                buf = rest[length:]
                conn.sendall(_ANSWER)


def _http_client(port: int) -> Callable[[], None]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Content-Type": "application/json"}

    def pull() -> None:
        body = json.dumps({"node": "f1", "epoch": 1, "after": 5, "wait_ms": 500}).encode()
        conn.request("POST", "/v1/replica/pull", body, headers)
        answer = conn.getresponse()
        answer.read()
        answer.getheader("X-DQ-Epoch")
        answer.getheader("X-DQ-Commit")

    return pull


def _leader_client(port: int) -> Callable[[], None]:
    client = LeaderClient(f"http://127.0.0.1:{port}")

    def pull() -> None:
        client.pull("f1", 1, 5, 500)

    return pull


def _cpu_per_call(pull: Callable[[], None], n: int) -> float:
    for _ in range(200):
        pull()
    t0 = time.thread_time()
    for _ in range(n):
        pull()
    return (time.thread_time() - t0) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pulls", type=int, default=3000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    threading.Thread(target=_serve, args=(listener,), daemon=True).start()
    load = os.getloadavg()
    print(f"# {platform.node()} {os.cpu_count()} CPUs, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")  # fmt: skip
    print("| client | CPU per pull, median (min-max) |")
    print("| --- | --- |")
    for name, make in (("LeaderClient.pull", _leader_client), ("http.client", _http_client)):
        figures = [_cpu_per_call(make(port), args.pulls) for _ in range(args.runs)]
        print(
            f"| {name} | {statistics.median(figures):.0f} us "
            f"({min(figures):.0f}-{max(figures):.0f}) |"
        )
    listener.close()
    load = os.getloadavg()
    print(f"# load at the end {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


if __name__ == "__main__":
    main()
