"""Which items are on their way back from an expired lease after a restart
(``storage/returning.py``): with ``group_limit`` set, the marks the delivery index keeps
in memory are rebuilt from the stored write-back entry and its "lease expired" reason,
and only while nothing has written the item since. The failover side is tested in
``tests/storage/test_replication.py`` and ``tests/replication/test_rules_failover.py``."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dq.storage import Engine, NewItem, QueueConfig, Release, Requeue, RetryPolicy
from tests.storage.conftest import FakeClock


@pytest.mark.parametrize("frozen", [False, True])
def test_an_expired_lease_comes_back_first_of_its_group_after_a_restart(
    open_engine: Callable[..., Engine], clock: FakeClock, frozen: bool
) -> None:
    """With ``group_limit`` 1 and a retry delay, an item whose lease ran out is written
    back later than its group's next item, and the group waits for it
    (``docs/delivery.md``, "An expired lease's place"): so it does after a restart,
    whether the write-back is still in the log or in a segment file. Another group goes
    on meanwhile; an item written back and delivered again whose lease the restart
    ended comes back first too, and once one is released its group goes on."""
    retry = RetryPolicy(delays_ms=(2000,))
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1, retry=retry))
    e.enqueue("q", [NewItem(b"a1", group="a"), NewItem(b"a2", group="a")])
    e.enqueue("q", [NewItem(b"b1", group="b"), NewItem(b"b2", group="b")])
    assert len(e.dequeue("q", 2, 1000)) == 2  # a1 and b1
    clock.advance(1500)
    assert e.queue("q").expire_leases() == 2  # both back 2 s from now
    if frozen:
        e.freeze("q")
    e.close()
    e = open_engine()
    # both groups wait for their written-back first item
    assert e.dequeue("q", 2, 1000) == []
    clock.advance(2000)
    got = e.dequeue("q", 2, 60_000)
    assert sorted(d.value for d in got) == [b"a1", b"b1"]
    b = next(d for d in got if d.group == "b")
    e.release("q", [Release(b.id, b.receipt)])  # b1 done: b2 is next
    e.close()  # a1's second lease ends with the restart
    e = open_engine()
    got = e.dequeue("q", 2, 60_000)
    assert sorted(d.value for d in got) == [b"a1", b"b2"]


def test_an_expired_lease_handed_back_again_takes_its_place_by_deadline_after_a_restart(
    open_engine: Callable[..., Engine], clock: FakeClock
) -> None:
    """An item whose lease ran out, delivered again and then requeued by its consumer is
    no longer on its way back from an expired lease: after a restart, as before it, its
    group's earlier item goes first (the write-back's mark is read from the stored
    entry and reason of the expiry, which the requeue wrote over)."""
    e = open_engine()
    e.put_queue("q", QueueConfig(group_limit=1, retry=RetryPolicy(delays_ms=(2000,))))
    e.enqueue("q", [NewItem(b"a1", group="a"), NewItem(b"a2", group="a")])
    e.dequeue("q", 1, 1000)
    clock.advance(1500)
    assert e.queue("q").expire_leases() == 1
    clock.advance(2000)
    (a1,) = e.dequeue("q", 1, 1000)
    assert a1.value == b"a1"
    (done,) = e.requeue("q", [Requeue(a1.id, a1.receipt, delay_ms=1000)])
    assert done.error is None
    e.close()
    e = open_engine()
    assert [d.value for d in e.dequeue("q", 2, 60_000)] == [b"a2"]
