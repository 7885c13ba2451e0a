"""Ids are never reused: recovery takes the id counter from the segment files' footers too.

``docs/storage.md`` ("Ids", "Recovery"): the counter is restored from the footers'
``max_id``, the logs' headers (id floor) and the logs' entries. On a directory as the
engine leaves it the current log's header alone carries the next id, so a recovery that
ignored the footers would go unnoticed — until a queue directory holds segment files and
no log: what salvaging a damaged log (moved out, ``docs/reliability.md``), a lost file
or a partial copy leaves. Such a queue must go on from the highest id its segment files
name, not hand out id 1 again beside the item that already has it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine, NewItem, QueueConfig, Release

LEASE_MS = 60_000


@pytest.mark.parametrize("released", [False, True], ids=["pending", "released"])
def test_a_queue_with_segment_files_and_no_log_goes_on_from_their_highest_id(
    open_engine: Callable[..., Engine], tmp_path: Path, released: bool
) -> None:
    """``pending``: the items wait in a segment file. ``released``: they were delivered
    and released, so no entry of theirs is pending anywhere and only the footers (of
    the segment holding them and of the one holding their tombstones) remember ids 1-3."""
    data = tmp_path / "data"
    engine = open_engine(path=data)
    engine.put_queue("q", QueueConfig())
    first = engine.enqueue("q", [NewItem(b"a"), NewItem(b"b"), NewItem(b"c")])
    assert [e.id for e in first] == [1, 2, 3]
    engine.freeze("q")  # 0000000001-0000000001.seg; the next log's header says 4
    if released:
        got = engine.dequeue("q", 3, LEASE_MS)
        assert all(o.ok for o in engine.release("q", [Release(d.id, d.receipt) for d in got]))
        engine.freeze("q")  # their tombstones: 0000000002-0000000002.seg
    engine.close()

    queue_dir = data / "queues" / "q"
    logs = sorted(p.name for p in queue_dir.iterdir() if ".log" in p.name)
    segments = sorted(p.name for p in queue_dir.iterdir() if p.suffix == ".seg")
    assert logs and segments, sorted(p.name for p in queue_dir.iterdir())
    for name in logs:
        (queue_dir / name).unlink()  # segment files and no log

    engine = open_engine(path=data)
    (later,) = engine.enqueue("q", [NewItem(b"d")])
    assert later.id == 4, f"id {later.id} handed out again after reopening {segments}"
    delivered = [(d.id, d.value) for d in engine.dequeue("q", 10, LEASE_MS)]
    if released:
        assert delivered == [(4, b"d")]
    else:
        assert delivered == [(1, b"a"), (2, b"b"), (3, b"c"), (4, b"d")]
    assert engine.stats("q").next_id == 5
