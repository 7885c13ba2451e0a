"""A follower whose compaction worker hangs stays within the bound a leader keeps.

Three ``dq serve`` members and etcd, logs of 64 KiB. One follower's freeze worker (its
``python -m dq.storage.worker`` child) is stopped with SIGSTOP, as a worker stuck on a
slow disk would be, and the leader takes writes worth many logs. The follower rotates
two logs that then wait for their segment files (``max_frozen``); its third log reaches
twice ``memseg_bytes`` and its writes are stalled, as a leader's would be
(``FileJobs.refuse_if_stalled``): it takes no further record from the leader, so it
acknowledges nothing, reports ``stalled``, and leaves the sync set after the group's
replica timeout while the leader and the other follower go on acknowledging every write.
Checked while the worker is stopped: every log of the follower (what ``dq inspect``
reads of its valid bytes) holds at most twice ``memseg_bytes`` plus one record, and its
in-memory segments (``stats.extra.memory_bytes``) at most ``max_frozen`` + 1 such logs.
Once the worker runs again the follower applies the rest, rejoins the sync set and holds
every acknowledged item with its value.
"""

from __future__ import annotations

import base64
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest

from dq.client import Client
from dq.client import NewItem as ClientItem
from dq.storage.config import EngineConfig
from dq.storage.wal import read_wal
from tests.replication.cluster import QUEUE, Cluster, eventually
from tests.server.live import LiveServer, browse_all
from tests.stopped import sigstop

# integration: three dq serve members and etcd
pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MEMSEG = 64 << 10
BATCH = 20
VALUE_BYTES = 750
#: one record of a batch, framed, with room to spare (its entries' keys, stats, lengths)
RECORD = BATCH * (VALUE_BYTES + 64) + 1024
#: what one log may hold: twice its limit, plus the record that crossed it
LOG_BOUND = 2 * MEMSEG + RECORD
#: writes worth this many logs while the follower's worker is stopped
LOGS_WRITTEN = 18


@pytest.fixture
def group_env() -> dict[str, str]:
    """Logs freeze at 64 KiB, so a few writes fill several."""
    return {"DQ_MEMSEG_BYTES": str(MEMSEG)}


def freeze_worker(server: LiveServer) -> psutil.Process | None:
    """The member's freeze worker (``python -m dq.storage.worker <pid> 0``; the merge
    worker runs at nice 5), once it has been started by a first freeze."""
    assert server.proc is not None
    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            argv = child.cmdline()
        except psutil.NoSuchProcess:
            continue
        if "dq.storage.worker" in argv and argv[-1] == "0":
            return child
    return None


def extra(server: LiveServer) -> dict[str, int]:
    r = httpx.get(f"{server.url}/v1/queues/{QUEUE}", timeout=10)
    r.raise_for_status()
    out: dict[str, int] = r.json()["stats"]["extra"]
    return out


def log_bytes(server: LiveServer) -> dict[str, int]:
    """The valid bytes of each of the member's logs of the queue, open or closed (what
    ``dq inspect`` says of each: a log's file may run on in zeros allocated ahead)."""
    folder = server.data_dir / "queues" / QUEUE
    return {
        p.name: read_wal(str(p)).valid_end
        for p in sorted(folder.iterdir())
        if p.suffix in (".log", ".log_ro")
    }


def applied(group: Cluster, node: str, lead: str) -> bool | None:
    return True if group.describe(node)["lsn"] == group.describe(lead)["lsn"] else None


def in_sync_set(group: Cluster, node: str, present: bool) -> bool | None:
    view = group.view()
    if view.sync is None:
        return None
    return True if (node in view.sync.members) == present else None


@pytest.fixture
def stopped() -> Iterator[list[psutil.Process]]:
    """Processes the test stops; each is sent SIGCONT at the end, whatever happens."""
    procs: list[psutil.Process] = []
    yield procs
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


def test_a_follower_with_a_hung_compaction_worker_stays_bounded_and_loses_nothing(
    group: Cluster, stopped: list[psutil.Process]
) -> None:
    view = eventually("a leader with two followers in sync", lambda: group.in_sync(3))
    assert view.leader is not None and view.sync is not None
    lead = view.leader.node
    slow = sorted(n for n in view.sync.members if n != lead)[0]
    member = group.servers[slow]
    acked: dict[int, bytes] = {}

    def write(dq: Client) -> None:
        values = [os.urandom(VALUE_BYTES) for _ in range(BATCH)]
        for got, value in zip(
            dq.enqueue_many(QUEUE, [ClientItem(v, delay_ms=3_600_000) for v in values]),
            values,
            strict=True,
        ):
            acked[got.id] = value

    with Client(view.leader.url, timeout=30) as dq:
        # a first freeze starts the member's freeze worker; it is stopped once idle
        def worker_started() -> psutil.Process | None:
            write(dq)
            return freeze_worker(member)

        worker = eventually("the follower's freeze worker", worker_started, 60)
        eventually("the follower to apply every record", lambda: applied(group, slow, lead))
        eventually(
            "the follower's first freezes to finish", lambda: extra(member)["frozen"] == 0 or None
        )
        sigstop(worker.pid)
        stopped.append(worker)

        before = len(acked)
        while len(acked) - before < LOGS_WRITTEN * MEMSEG // VALUE_BYTES:
            write(dq)  # every one acknowledged: the other follower keeps the sync set

        def reported() -> bool | None:
            error = group.describe(slow)["replica"]["last_error"]
            return True if error is not None and error["code"] == "stalled" else None

        # it stops taking records (the old behaviour: it took them all, past the bound)
        eventually(
            "the follower to stall or take every record",
            lambda: reported() or applied(group, slow, lead),
            30,
        )
        logs = log_bytes(member)
        figures = extra(member)
        max_frozen = EngineConfig().max_frozen
        assert figures["frozen"] == max_frozen, figures
        assert len(logs) == max_frozen + 1, logs
        assert max(logs.values()) <= LOG_BOUND, logs
        assert figures["memory_bytes"] <= (max_frozen + 1) * LOG_BOUND, (figures, logs)
        # what the operator sees: it reports its stall, lags, and has left the sync set
        assert reported()
        assert group.describe(slow)["lsn"] < group.describe(lead)["lsn"]
        eventually("the follower to leave the sync set", lambda: in_sync_set(group, slow, False))

        # the worker runs again: the follower catches up, rejoins, and has every write
        worker.send_signal(signal.SIGCONT)
        eventually("the follower to catch up", lambda: applied(group, slow, lead), 90)
        eventually("the follower to rejoin the sync set", lambda: in_sync_set(group, slow, True))
    items = browse_all(member.url, QUEUE, values="true")
    assert len(items) == len(acked)
    for item in items:
        assert acked[item["id"]] == decode(item), item["id"]
    assert max(log_bytes(member).values()) <= LOG_BOUND


def decode(item: dict[str, Any]) -> bytes:
    """A browsed item's value as bytes."""
    if item["encoding"] == "base64":
        return base64.b64decode(item["value"])
    return str(item["value"]).encode()
