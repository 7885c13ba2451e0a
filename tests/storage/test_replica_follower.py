"""A queue's part in following a replica group (``storage/replica_follower.py``), driven
through the engine as the follower's pull loop drives it: a leader engine ships to a list
(the test plays the network), a follower engine applies the frames, then takes over."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from dq.storage import Engine, NewItem, QueueConfig, Release
from dq.storage.errors import CorruptionError
from dq.storage.replication import KIND_RECORD, KIND_RECORD_WITH_META
from tests.storage.shipping import AutoCommit, leading


def _follower(engines: Any) -> Engine:
    follower = engines("follower")
    follower.set_role(False, "http://leader:1")
    return follower


def test_a_follower_that_takes_over_keeps_the_groups_and_never_reuses_an_id(
    engines: Any,
) -> None:
    leader, sink = leading(engines)
    with AutoCommit(leader, sink):
        leader.put_queue("q", QueueConfig(group_limit=1))
        leader.enqueue("q", [NewItem(b"a1", 0, group="a"), NewItem(b"a2", 0, group="a")])
        leader.enqueue("q", [NewItem(b"last", 0)])
        got = leader.dequeue("q", 3, 60_000)
        last = next(d for d in got if d.value == b"last")
        leader.release("q", [Release(last.id, last.receipt)])  # its id only in a tombstone
    assert {f.kind for f in sink.frames} >= {KIND_RECORD, KIND_RECORD_WITH_META}
    follower = _follower(engines)
    follower.apply(sink.frames).result(timeout=10)
    follower.set_role(True)
    # the groups came with the records: a2 waits for a1, as on the leader
    assert [d.value for d in follower.dequeue("q", 10, 60_000)] == [b"a1"]
    [new] = follower.enqueue("q", [NewItem(b"new", 0)])
    assert new.id > last.id


def test_a_damaged_record_is_refused_and_appends_nothing(engines: Any) -> None:
    leader, sink = leading(engines)
    with AutoCommit(leader, sink):
        leader.enqueue("q", [NewItem(b"kept", 0)])
        leader.enqueue("q", [NewItem(b"damaged", 0)])
    *good, last = sink.frames
    follower = _follower(engines)
    follower.apply(good).result(timeout=10)
    cut = dataclasses.replace(last, payload=last.payload[:-3])
    with pytest.raises(CorruptionError, match="replicated record of queue q"):
        follower.apply([cut]).result(timeout=10)
    follower.set_role(True)
    [d] = follower.dequeue("q", 10, 60_000)
    assert d.value == b"kept"
    [new] = follower.enqueue("q", [NewItem(b"next", 0)])
    assert new.id == d.id + 1  # the damaged record's id was not taken
