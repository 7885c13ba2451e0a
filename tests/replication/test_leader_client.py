"""The pull's own HTTP/1.1 handling, against a socket server that answers canned bytes:
framings (Content-Length, chunked, closed connection), keep-alive, and answers that are
cut short or malformed (an error, never a partial body taken for a whole one)."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator

import pytest

from dq.server.replication.leader_client import LeaderClient, LeaderRefused

pytestmark = pytest.mark.integration  # canned HTTP servers on 127.0.0.1


class Canned:
    """Accepts connections; answers each request with the next canned bytes (then
    closes the connection if the entry says so). Records every request."""

    def __init__(self, answers: list[tuple[bytes, bool]]) -> None:
        self.answers = answers
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                buf = b""
                while self.answers:
                    while b"\r\n\r\n" not in buf:
                        data = conn.recv(65536)
                        if not data:
                            break
                        buf += data
                    if b"\r\n\r\n" not in buf:
                        break
                    head, _, rest = buf.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    while len(rest) < length:
                        rest += conn.recv(65536)
                    self.requests.append(head + b"\r\n\r\n" + rest[:length])
                    buf = rest[length:]
                    answer, close = self.answers.pop(0)
                    conn.sendall(answer)
                    if close:
                        break

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def canned(request: pytest.FixtureRequest) -> Iterator[Canned]:
    server = Canned(list(request.param))
    yield server
    server.close()


def ok(body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nX-DQ-Epoch: 4\r\nX-DQ-Commit: 9\r\n" + extra
        + b"Content-Length: %d\r\n\r\n" % len(body) + body
    )  # fmt: skip


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nx-dq-epoch: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\n"
)


@pytest.mark.parametrize(
    "canned", [[(ok(b"one"), False), (ok(b"two"), False), (CHUNKED, False)]], indirect=True
)
def test_pulls_keep_one_connection_and_read_both_framings(canned: Canned) -> None:
    client = LeaderClient(canned.url, token="t0k")
    first = client.pull("f1", 4, 7, 100)
    assert (first.body, first.epoch, first.commit_lsn) == (b"one", 4, 9)
    assert client.pull("f1", 4, 8, 100).body == b"two"
    chunked = client.pull("f1", 4, 8, 100)
    assert chunked.body == b"hello world" and chunked.epoch == 4 and chunked.commit_lsn is None
    assert canned.connections == 1
    head, _, body = canned.requests[0].partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/replica/pull HTTP/1.1\r\n")
    assert b"\r\nAuthorization: Bearer t0k" in head and b"\r\nHost: 127.0.0.1:" in head
    assert body == b'{"node": "f1", "epoch": 4, "after": 7, "wait_ms": 100}'
    client.close()


CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nA"
TO_EOF = b"HTTP/1.1 200 OK\r\nX-DQ-Epoch: 4\r\n\r\nuntil the end"


@pytest.mark.parametrize(
    "canned", [[(CLOSE, True), (TO_EOF, True), (ok(b"C"), False)]], indirect=True
)
def test_a_closing_answer_is_read_whole_and_the_next_pull_reconnects(canned: Canned) -> None:
    client = LeaderClient(canned.url)
    assert client.pull("f1", 4, 0, 0).body == b"A"
    assert client.pull("f1", 4, 0, 0).body == b"until the end"
    assert client.pull("f1", 4, 0, 0).body == b"C"
    assert canned.connections == 3
    client.close()


def refusal(status: bytes, doc: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 " + status + b"\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(doc) + doc


@pytest.mark.parametrize(
    "canned",
    [[
        (refusal(b"421 Misdirected", b'{"error":"not_leader","message":"m"}', b"X-DQ-Leader: http://n2:8080\r\n"), False),
        (refusal(b"409 Conflict", b'{"error":"resync_needed","message":"start over"}'), False),
        (ok(b"after the refusals"), False),
    ]],
    indirect=True,
)  # fmt: skip
def test_refusals_carry_their_code_and_keep_the_connection(canned: Canned) -> None:
    client = LeaderClient(canned.url)
    with pytest.raises(LeaderRefused) as first:
        client.pull("f1", 4, 0, 0)
    assert (first.value.status, first.value.code, first.value.leader) == (
        421,
        "not_leader",
        "http://n2:8080",
    )
    with pytest.raises(LeaderRefused) as second:
        client.pull("f1", 4, 0, 0)
    assert (second.value.status, second.value.code, second.value.message) == (
        409,
        "resync_needed",
        "start over",
    )
    assert client.pull("f1", 4, 0, 0).body == b"after the refusals"
    assert canned.connections == 1
    client.close()


@pytest.mark.parametrize(
    ("canned", "error"),
    [
        ([(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", True)], http.client.IncompleteRead),
        ([(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", True)], http.client.IncompleteRead),
        ([(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", True)], http.client.HTTPException),
        ([(b"HTTP/1.1 200 OK\r\nX-DQ-Epoch: 4\r\n", True)], http.client.IncompleteRead),
        ([(b"SMTP ready\r\n", True)], http.client.BadStatusLine),
        ([(b"", True)], http.client.RemoteDisconnected),
        ([(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", True)], http.client.HTTPException),
    ],
    indirect=["canned"],
)  # fmt: skip
def test_an_answer_cut_short_or_malformed_is_an_error(
    canned: Canned, error: type[Exception]
) -> None:
    client = LeaderClient(canned.url, timeout_s=2.0)
    with pytest.raises(error):
        client.pull("f1", 4, 0, 0)
    client.close()
