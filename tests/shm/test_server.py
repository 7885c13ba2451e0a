"""The shared-memory server end to end: attach, every op through a ring, a C client written
from the layout alone, and no leaked /dev/shm objects however a client goes away."""

from __future__ import annotations

import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dq.server.lifespan import _local_url
from dq.server.settings import Settings
from dq.shm import command_codec as codec
from dq.shm.attach import SHM_DIR, Attachment, attach, shm_prefix
from dq.shm.command_ring import ClientRing, Op, Response, Status
from dq.shm.errors import AttachError, ShmError
from dq.shm.server import ShmServer
from dq.storage import Engine, EngineConfig
from dq.storage.types import NewItem, QueueConfig
from tests.shm.conftest import WAIT_S, eventually

C_CLIENT = Path(__file__).parent / "c" / "ring_client.c"


def rings_of(server: ShmServer) -> list[str]:
    return sorted(p.name for p in SHM_DIR.glob(f"{server.shm_prefix}*"))


def connect(server: ShmServer, queue: str | None = "jobs") -> tuple[Attachment, ClientRing]:
    a = attach(server.data_dir, queue=queue, capacity=8)
    return a, ClientRing(a.mm, spin_us=0.0)


def test_attach_gives_a_private_ring_and_detach_unlinks_it(
    served: tuple[Engine, ShmServer],
) -> None:
    _, server = served
    assert stat.S_IMODE(server.socket_path.stat().st_mode) == 0o600
    a, ring = connect(server)
    path = SHM_DIR / a.name.lstrip("/")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.stat().st_size == 24 + 2080 * 8 == len(a.mm)
    assert ring.capacity == 8 and a.capacity == 8
    assert a.name.startswith("/" + shm_prefix(server.data_dir))
    assert eventually(lambda: server.session_count == 1)
    ring.close()
    a.close()
    assert eventually(lambda: not path.exists())
    assert eventually(lambda: server.session_count == 0)


def test_every_op_through_the_ring(served: tuple[Engine, ShmServer]) -> None:
    engine, server = served
    a, ring = connect(server, queue=None)
    try:
        r = ring.call(Op.PUT, codec.encode_put(None, None), b"x")
        assert r.status == Status.NOT_BOUND
        assert ring.call(Op.BIND, bytes(16), b"no/such").status == Status.INVALID_QUEUE_NAME
        assert ring.call(Op.BIND, bytes(16), b"jobs").status == Status.OK

        ids = [
            codec.decode_put_ok(ring.call(Op.PUT, codec.encode_put(None, None), v).body)[0]
            for v in (b"a", b"b" * 1024, b"c")
        ]
        assert ids == sorted(ids) and len(set(ids)) == 3
        future = engine.now() + 3_600_000
        r = ring.call(Op.PUT, codec.encode_put(future, None), b"later")
        assert codec.decode_put_ok(r.body)[1] == future
        r = ring.call(Op.PUT, codec.encode_put(1 << 50, None), b"too far")
        assert r.status == Status.VALIDATION_ERROR  # the field's rule, as over HTTP (422)

        # one FIND whose response spans two slots (the 1024-byte value): CONTINUE joins them
        r = ring.call(Op.FIND, codec.encode_find(10, 0, 60_000))
        got = codec.decode_deliveries(r.body)
        assert [d.value for d in got] == [b"a", b"b" * 1024, b"c"]
        assert ring.call(Op.CONTINUE, bytes(16)).status == Status.NO_CONTINUATION

        a_, b_, c_ = got
        key, value = codec.encode_item(a_.id, a_.receipt)
        assert ring.call(Op.DELETE, key, value).status == Status.OK
        assert ring.call(Op.DELETE, key, value).status == Status.STALE_RECEIPT
        key, value = codec.encode_extend(b_.id, b_.receipt, 120_000)
        r = ring.call(Op.EXTEND, key, value)
        assert r.status == Status.OK
        expires, receipt = codec.decode_extend_ok(r.body)
        assert expires >= b_.lease_expires and receipt
        key, value = codec.encode_requeue(c_.id, c_.receipt, None, None)
        r = ring.call(Op.REQUEUE, key, value)
        assert r.status == Status.OK
        again = codec.decode_deliveries(ring.call(Op.FIND, codec.encode_find(1, 2000, None)).body)
        assert [(d.id, d.value, d.stats.dequeue_count) for d in again] == [(c_.id, b"c", 2)]

        stats = ring.call(Op.STATS, bytes(16))
        assert stats.status == Status.OK
        assert b'"name":"jobs"' in stats.body
        assert ring.call(200, bytes(16)).status == Status.UNKNOWN_OP
        key, value = codec.encode_item(10**9, "nope.1.1")
        assert ring.call(Op.DELETE, key, value).status in (
            Status.ITEM_NOT_FOUND,
            Status.INVALID_RECEIPT,
            Status.STALE_RECEIPT,
        )
    finally:
        ring.close()
        a.close()


def test_find_waits_for_an_item_enqueued_meanwhile(served: tuple[Engine, ShmServer]) -> None:
    engine, server = served
    engine.put_queue("jobs", QueueConfig())
    a, ring = connect(server)
    try:
        started = time.monotonic()
        assert (
            codec.decode_deliveries(ring.call(Op.FIND, codec.encode_find(1, 50, None)).body) == []
        )
        assert time.monotonic() - started >= 0.04
        # a producer enqueues while the FIND long-polls
        timer = threading.Timer(0.1, lambda: engine.enqueue("jobs", [NewItem(b"late")]))
        timer.start()
        r = ring.call(Op.FIND, codec.encode_find(1, 5_000, None))
        timer.join(WAIT_S)
        assert [d.value for d in codec.decode_deliveries(r.body)] == [b"late"]
    finally:
        ring.close()
        a.close()


def test_pipelined_puts_are_answered_in_order(served: tuple[Engine, ShmServer]) -> None:
    _, server = served
    a, ring = connect(server)
    try:
        with ring.lock:
            slots = [
                ring.submit(Op.PUT, codec.encode_put(None, None), f"v{i}".encode())
                for i in range(7)
            ]
            ids = [codec.decode_put_ok(ring.wait(s).body)[0] for s in slots]
        assert ids == sorted(ids) and len(set(ids)) == 7
        got = codec.decode_deliveries(ring.call(Op.FIND, codec.encode_find(7, 0, None)).body)
        assert [d.value for d in got] == [f"v{i}".encode() for i in range(7)]
    finally:
        ring.close()
        a.close()


def test_attach_is_refused_cleanly(served: tuple[Engine, ShmServer]) -> None:
    _, server = served
    with pytest.raises(AttachError):
        attach(server.data_dir, queue="bad name!")
    with pytest.raises(AttachError):
        attach(server.data_dir, capacity=1)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(WAIT_S)
    sock.connect(str(server.socket_path))
    sock.sendall(b"not json\n")
    assert sock.recv(4096) == b""  # dropped
    sock.close()
    assert eventually(lambda: server.session_count == 0)
    assert rings_of(server) == []


def test_a_data_dir_too_long_for_a_unix_socket_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / ("d" * 120)
    engine = Engine.open(data, EngineConfig(fsync="never"))
    try:
        with pytest.raises(ShmError, match="107 bytes"):
            ShmServer(engine, data).start()
    finally:
        engine.close()


def _build_c_client(tmp_path: Path) -> Path:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    exe = tmp_path / "ring_client"
    subprocess.run(
        [cc, "-O1", "-Wall", "-Werror", "-o", str(exe), str(C_CLIENT), "-lrt"],
        check=True,
        timeout=120,
    )
    return exe


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["wake", "nowake"])
def test_a_c_client_written_from_the_layout_enqueues_dequeues_and_releases(
    served: tuple[Engine, ShmServer], tmp_path: Path, mode: str
) -> None:
    engine, server = served
    exe = _build_c_client(tmp_path)
    out = subprocess.run(
        [str(exe), str(server.data_dir), "from-c", mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[1].startswith("enqueued ")
    item_id = int(lines[1].split()[1])
    assert lines[2] == f"dequeued {item_id} hello from C"
    assert lines[3] == f"released {item_id} status 0"
    assert lines[4].startswith("released again status 9")
    stats = engine.stats("from-c")
    assert (stats.pending, stats.leased) == (0, 0)
    assert eventually(lambda: rings_of(server) == [])


KILLED_CLIENT = """
import os, signal, sys
from dq.shm.attach import attach
from dq.shm.command_ring import ClientRing, Op
from dq.shm import command_codec as codec
a = attach(sys.argv[1], queue="jobs")
ring = ClientRing(a.mm)
print(a.name, flush=True)
mode = sys.argv[2]
if mode == "mid-command":
    ring.submit(Op.PUT, codec.encode_put(None, None), b"orphan")
elif mode == "mid-find":
    ring.submit(Op.FIND, codec.encode_find(1, 60_000, None), b"")
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["idle", "mid-command", "mid-find"])
def test_a_killed_client_leaves_no_ring_behind(served: tuple[Engine, ShmServer], mode: str) -> None:
    _, server = served
    child = subprocess.run(
        [sys.executable, "-c", KILLED_CLIENT, str(server.data_dir), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert child.returncode == -signal.SIGKILL
    name = child.stdout.strip()
    assert name.startswith("/dq-")
    assert eventually(lambda: not (SHM_DIR / name.lstrip("/")).exists())
    assert eventually(lambda: server.session_count == 0)
    a, ring = connect(server)  # the server serves on
    try:
        r = ring.call(Op.PUT, codec.encode_put(None, None), b"after")
        assert r.status == Status.OK
    finally:
        ring.close()
        a.close()


def test_server_close_unlinks_every_ring_and_the_socket(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = Engine.open(data, EngineConfig(fsync="never"))
    try:
        # a leftover of an earlier crash of this data directory is removed at start
        leftover = SHM_DIR / f"{shm_prefix(data)}1-deadbeef"
        leftover.write_bytes(b"")
        # as the lifespan starts it: the address told to clients is a local one
        settings = Settings(data_dir=str(data), host="0.0.0.0", port=8181)
        server = ShmServer(engine, data, http_url=_local_url(settings)).start()
        assert not leftover.exists()
        attachments = [connect(server) for _ in range(3)]
        assert attachments[0][0].http_url == "http://127.0.0.1:8181"
        assert eventually(lambda: len(rings_of(server)) == 3)
        server.close()
        assert rings_of(server) == []
        assert not server.socket_path.exists()
        for a, ring in attachments:
            ring.close()
            a.close()
    finally:
        engine.close()


def send(ring: ClientRing, slots: list[tuple[int, bytes, bytes]]) -> Response:
    """One command over several slots (PARTs, then the op), as the client transport sends it."""
    with ring.lock:
        indexes = [ring.submit(op, key, value, WAIT_S, wake=False) for op, key, value in slots]
        ring.wake_server()
        return ring.collect(indexes, WAIT_S)


def test_batch_commands_and_misplaced_parts(served: tuple[Engine, ShmServer]) -> None:
    """PUT_MANY and DELETE_MANY over PART slots; PARTs before another op, a PART with bytes
    before a FIND, or a body_size that lies are refused, and the ring goes on."""
    engine, server = served
    a, ring = connect(server, queue=None)
    zero = bytes(16)
    try:
        key, body = codec.encode_put_many([(b"x" * 300, None, None, None)] * 6)
        pieces = [body[i : i + 1024] for i in range(0, len(body), 1024)]
        slots = [(Op.PART, zero, p) for p in pieces[:-1]] + [(Op.PUT_MANY, key, pieces[-1])]
        assert send(ring, slots).status == Status.NOT_BOUND
        assert ring.call(Op.BIND, zero, b"jobs").status == Status.OK
        r = send(ring, slots)
        assert r.status == Status.OK and not r.more
        ids = [i for i, _, dup, _replaced in codec.decode_put_many_ok(r.body, 6) if not dup]
        assert len(ids) == 6 and engine.stats("jobs").pending == 6

        # a FIND with two empty PARTs before it: the 6 x 362-byte answer spans its slots
        r = send(
            ring,
            [
                (Op.PART, zero, b""),
                (Op.PART, zero, b""),
                (Op.FIND, codec.encode_find(6, 0, 60_000), b""),
            ],
        )
        got = codec.decode_deliveries(r.body)
        assert [d.id for d in got] == ids
        stale = got[0]
        key, value = codec.encode_item(stale.id, stale.receipt)
        assert ring.call(Op.DELETE, key, value).status == Status.OK
        key, body = codec.encode_delete_many([(d.id, d.receipt) for d in got])
        r = send(ring, [(Op.PART, zero, body[:20]), (Op.DELETE_MANY, key, body[20:])])
        answers = codec.decode_delete_many_ok(r.body, 6)
        assert [s for s, _ in answers] == [Status.STALE_RECEIPT] + [0] * 5
        assert answers[0][1] and engine.stats("jobs").pending == 0

        assert send(ring, [(Op.PART, zero, b""), (Op.STATS, zero, b"")]).status == Status.MALFORMED
        find = (Op.FIND, codec.encode_find(1, 0, None), b"")
        assert send(ring, [(Op.PART, zero, b"x"), find]).status == Status.MALFORMED
        lying = struct.pack("<IIQ", 1, 999, 0)
        assert send(ring, [(Op.PUT_MANY, lying, pieces[0])]).status == Status.MALFORMED
        assert ring.call(Op.STATS, zero).status == Status.OK  # served on
        assert engine.stats("jobs").pending == 0
    finally:
        ring.close()
        a.close()
