"""Many client processes at once, 100,000 operations in all: no response is lost,
duplicated or delivered to the wrong client.

Every process enqueues values that name it and their sequence number, checks each PUT's
answer, then dequeues and releases. At the end every enqueued value was either dequeued by
exactly one process or is still in the queue, each PUT's id names the item holding that
process's value, and no two PUTs got the same id.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dq.shm.server import ShmServer
from dq.storage import Engine, EngineConfig

pytestmark = pytest.mark.integration  # many client processes

PROCESSES = 4
PUTS = 10_000  # per process
FINDS = 7_500  # per process, each followed by a DELETE: 4 x (10,000 + 2 x 7,500) = 100,000

WORKER = """
import json, sys
from dq.shm.attach import attach
from dq.shm.command_ring import ClientRing, Op, Status
from dq.shm import command_codec as codec

data_dir, me, puts, finds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
a = attach(data_dir, queue="stress", capacity=16)
ring = ClientRing(a.mm)
put_key = codec.encode_put(None, None)
ids = {}
for i in range(puts):
    value = f"p{me}-{i}".encode()
    r = ring.call(Op.PUT, put_key, value, timeout_s=60)
    assert r.status == Status.OK, (r.status, r.body)
    ids[i] = codec.decode_put_ok(r.body)[0]
got = []
find_key = codec.encode_find(1, 0, 600_000)
for _ in range(finds):
    r = ring.call(Op.FIND, find_key, timeout_s=60)
    assert r.status == Status.OK, (r.status, r.body)
    for d in codec.decode_deliveries(r.body):
        key, value = codec.encode_item(d.id, d.receipt)
        rel = ring.call(Op.DELETE, key, value, timeout_s=60)
        assert rel.status == Status.OK, (rel.status, rel.body)
        got.append([d.id, d.value.decode()])
print(json.dumps({"ids": ids, "got": got}))
"""


@pytest.mark.slow
def test_many_processes_no_lost_duplicated_or_crossed_responses(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = Engine.open(data, EngineConfig(fsync="never"))
    server = ShmServer(engine, data).start()
    procs: list[subprocess.Popen[str]] = []
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER, str(data), str(p), str(PUTS), str(FINDS)],
                stdout=subprocess.PIPE,
                text=True,
            )
            for p in range(PROCESSES)
        ]
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0
            results.append(json.loads(out))
        id_of: dict[str, int] = {}
        for p, res in enumerate(results):
            for i, item_id in res["ids"].items():
                id_of[f"p{p}-{i}"] = item_id
        assert len(id_of) == PROCESSES * PUTS
        assert len(set(id_of.values())) == len(id_of)  # no PUT answer went to two clients

        dequeued = [(item_id, value) for res in results for item_id, value in res["got"]]
        rest = engine.dequeue("stress", 1000, 600_000)
        while rest:
            dequeued += [(d.id, d.value.decode()) for d in rest]
            rest = engine.dequeue("stress", 1000, 600_000)
        values = [value for _, value in dequeued]
        assert len(values) == len(set(values)) == PROCESSES * PUTS  # none lost, none twice
        for item_id, value in dequeued:
            assert id_of[value] == item_id  # each PUT's answer named its own item
        assert sum(len(res["got"]) for res in results) == PROCESSES * FINDS
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=60)
        server.close()
        engine.close()
