"""Each acknowledged write is in its log, synced, when it is acknowledged (``fsync="always"``).

``docs/storage.md``, "Durability": an enqueue, release or requeue — and an operator's
purge or delete, which write tombstones the same way — is acknowledged only after its
log record is on disk. Each test here makes one write, takes its acknowledgement, and
crashes at once, under the simulated power-loss layer (``storage/powerloss.py``):

- ``killed``: the process dies (SIGKILL): what was written stays in the page cache. A
  write kept only in memory — a release whose tombstone never reached the log — comes
  back as if it had never been made.
- ``power_loss``: everything not synced is lost too. A record written after its
  ``fdatasync`` rather than before is acknowledged by a sync that did not cover it, and
  is lost: a SIGKILL cannot show that, the page cache survives it.

Then a new engine opens what the crash left, and the write must be there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release, Requeue, fileio
from tests.storage.conftest import FakeClock
from tests.storage.faults import crash_engine

LEASE_MS = 60_000
CONFIG = EngineConfig(fsync="always", compaction="inline", auto_merge=False)


@pytest.mark.parametrize("crash", ["killed", "power_loss"])
@pytest.mark.parametrize("op", ["enqueue", "release", "requeue", "purge", "delete"])
def test_an_acknowledged_write_is_there_after_a_crash_right_after_it(
    tmp_path: Path, clock: FakeClock, op: str, crash: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    now, later = clock.now, clock.now + LEASE_MS
    with fileio.simulate_power_loss(str(data)) as power:
        engine = Engine.open(data, CONFIG, clock=clock)
        try:
            engine.put_queue("q", QueueConfig())
            a, _b = engine.enqueue("q", [NewItem(b"a"), NewItem(b"b")])
            if op == "enqueue":
                engine.enqueue("q", [NewItem(b"c", deadline=later)])
                expected = [(b"a", now), (b"b", now), (b"c", later)]
            elif op in ("release", "requeue"):
                (d,) = engine.dequeue("q", 1, LEASE_MS)
                assert d.id == a.id
                if op == "release":
                    (out,) = engine.release("q", [Release(d.id, d.receipt)])
                    expected = [(b"b", now)]
                else:
                    (out,) = engine.requeue("q", [Requeue(d.id, d.receipt, deadline=later)])
                    expected = [(b"b", now), (b"a", later)]
                assert out.ok, out
            elif op == "purge":
                assert engine.purge("q") == 2
                expected = []
            else:
                engine.delete_item("q", a.id)
                expected = [(b"b", now)]
        except BaseException:
            engine.close()
            raise
        crash_engine(engine, power, power_loss=crash == "power_loss")
        engine = Engine.open(data, CONFIG, clock=clock)
        try:
            page = engine.browse("q", "all", None, 100, True)
            assert [(i.value, i.deadline) for i in page.items] == expected, (
                f"an acknowledged {op} is not there after the process was {crash}"
            )
        finally:
            engine.close()
