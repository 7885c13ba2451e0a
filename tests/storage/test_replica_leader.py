"""A queue's part in leading a replica group (``storage/replica_leader.py``), driven through
the engine as the replicator drives it: a sink that keeps what is shipped (the test plays
the followers), the commit lsn moved by hand, the node made to stop leading, and the copy
a follower that (re)joins starts from."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, NewItem
from dq.storage.errors import ReplicationTimeout
from dq.storage.futures import answer
from tests.storage.shipping import AutoCommit, ListSink, leading

DOOMED = ReplicationTimeout("this node stopped leading; the outcome is unknown")


def _values(engine: Engine, queue: str) -> list[bytes]:
    page = engine.browse(queue, "all", limit=500, with_values=True)
    return [i.value for i in page.items]


def test_the_last_lsn_shipped_and_the_writes_waiting_for_the_commit(engines: Any) -> None:
    leader, sink = leading(engines)
    leader.ensure_queue("jobs")
    part = leader.queue("jobs").leader
    assert part.last_lsn == sink.last == 1  # the queue's creation
    fut = leader.enqueue_nowait("jobs", [NewItem(b"a", 0)])
    assert part.last_lsn == sink.last == 2
    assert part.awaits_commit() and not fut.done()
    leader.commit(sink.last)
    fut.result(timeout=5)
    assert not part.awaits_commit()


def test_writes_let_go_are_undone_and_answered_and_the_next_sink_numbers_anew(
    engines: Any,
) -> None:
    leader, sink = leading(engines)
    with AutoCommit(leader, sink):
        leader.enqueue("jobs", [NewItem(b"committed", 0)])
    q = leader.queue("jobs")
    waiting = leader.enqueue_nowait("jobs", [NewItem(b"in doubt", 0)])
    with q.lock:
        answers = q.leader.drop_replicated(DOOMED)
    assert [(r, e) for _f, r, e in answers] == [(None, DOOMED)]
    answer(answers)
    with pytest.raises(ReplicationTimeout, match="stopped leading"):
        waiting.result(timeout=5)
    assert q.leader.last_lsn == 0 and not q.leader.awaits_commit()
    # undone in memory: never published, and its barrier holds no dequeue back
    assert _values(leader, "jobs") == [b"committed"]
    nothing = ListSink()
    leader.set_replication(nothing)
    with AutoCommit(leader, nothing):
        leader.enqueue("jobs", [NewItem(b"next", 0)])
    assert q.leader.last_lsn == nothing.last == 1
    assert [d.value for d in leader.dequeue("jobs", 10)] == [b"committed", b"next"]


def test_the_copy_holds_every_shipped_record_and_names_its_lsn(engines: Any, clock: Any) -> None:
    leader, sink = leading(engines, memseg_bytes=8 << 10)  # segment files, closed logs, a live log
    with AutoCommit(leader, sink):
        for i in range(10):
            leader.enqueue("bulk", [NewItem(os.urandom(300), clock() + i) for _ in range(10)])
    dest = os.path.join(leader.root, ".replica-test")
    assert leader.snapshot(dest) == {"bulk": sink.last}
    names = os.listdir(os.path.join(dest, "queues", "bulk"))
    assert any(n.endswith(".seg") for n in names) and any(n.endswith(".log") for n in names)
    follower = engines("follower")
    follower.set_role(False, None)
    follower.replace_queues(dest)
    assert sorted(_values(follower, "bulk")) == sorted(_values(leader, "bulk"))


def test_a_damaged_queue_is_copied_as_it_lies(engines: Any, tmp_path: Path) -> None:
    e = engines("leader")
    e.enqueue("jobs", [NewItem(b"x", 0)])
    e.close()
    config = tmp_path / "leader" / "queues" / "jobs" / "queue.json"
    config.write_text("{not json")
    again = engines("leader")
    assert again.queue("jobs").quarantined
    dest = os.path.join(again.root, ".replica-test")
    assert again.snapshot(dest) == {"jobs": 0}
    copied = Path(dest, "queues", "jobs")
    assert (copied / "queue.json").read_text() == "{not json"
    assert any(n.endswith(".log") for n in os.listdir(copied))
