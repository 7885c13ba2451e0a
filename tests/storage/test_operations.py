"""Operator calls of the engine: pause/resume, browse/peek, purge, delete, redrive,
idempotent enqueue and the stats they add; each durable across a reopen."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dq.storage import (
    Engine,
    Extend,
    NewItem,
    QueueConfig,
    Release,
    Requeue,
    browse,
)
from dq.storage.errors import (
    BadCursor,
    InvalidArgument,
    InvalidKey,
    ItemNotFound,
    NotADeadLetterQueue,
    WriteStall,
)
from dq.storage.wal import WalWriter
from tests.storage.conftest import FakeClock

Open = Callable[..., Engine]


def values(engine: Engine, q: str, state: str = "all", limit: int = 1000) -> list[bytes]:
    page = engine.browse(q, state, None, limit, True)
    return [i.value or b"" for i in page.items]


def drain(engine: Engine, q: str) -> list[bytes]:
    got = engine.dequeue(q, 1000, 60_000)
    engine.release(q, [Release(d.id, d.receipt) for d in got])
    return [d.value for d in got]


# ---------------------------------------------------------------- pause / resume


def test_pause_hands_out_nothing_and_survives_reopen(
    open_engine: Open, clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a")])
    s = e.pause("q")
    assert s.paused and s.paused_since == clock.now
    e.enqueue("q", [NewItem(b"b")])  # writes go on
    assert e.dequeue("q", 10) == []
    assert e.next_wakeup("q") is None
    e.close()
    e = open_engine()
    assert e.stats("q").paused
    assert e.dequeue("q", 10) == []
    s = e.resume("q")
    assert not s.paused and s.paused_since is None
    assert [d.value for d in e.dequeue("q", 10)] == [b"a", b"b"]
    e.close()
    assert not open_engine().stats("q").paused


def test_paused_queue_still_expires_leases_and_accepts_release(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a"), NewItem(b"b")])
    a, b = e.dequeue("q", 2, 1000)
    e.pause("q")
    assert e.release("q", [Release(a.id, a.receipt)])[0].ok
    clock.advance(1001)
    assert e.expire_leases("q") == 1
    assert e.stats("q").lease_expired == 1
    assert e.dequeue("q") == []
    e.resume("q")
    assert [d.id for d in e.dequeue("q")] == [b.id]


def test_resume_wakes_watchers(open_engine: Open) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a")])
    e.pause("q")
    woken: list[int] = []
    e.watch("q", lambda: woken.append(1))
    e.resume("q")
    assert woken


# ---------------------------------------------------------------- browse / peek


def test_browse_pages_through_every_state_with_a_stable_cursor(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    now = clock.now
    e.enqueue("q", [NewItem(f"d{i}".encode()) for i in range(5)])
    e.enqueue("q", [NewItem(f"l{i}".encode(), deadline=now + 10_000 + i) for i in range(3)])
    e.freeze("q")  # some in a segment file, some in memory
    e.enqueue("q", [NewItem(b"d5")])
    leased = e.dequeue("q", 2, 5000)
    seen: list[tuple[int, str]] = []
    after = None
    while True:
        page = e.browse("q", "all", after, 3)
        assert len(page.items) <= 3
        seen += [(i.id, i.state) for i in page.items]
        if page.next is None:
            break
        # items coming and going do not disturb the cursor
        e.enqueue("q", [NewItem(b"late", deadline=now + 99_000)])
        after = page.next
    states = dict(seen)
    assert [states[d.id] for d in leased] == ["leased", "leased"]
    assert sum(1 for s in states.values() if s == "due") == 4
    assert sum(1 for _i, s in seen if s == "delayed") >= 3
    assert values(e, "q", "leased") == [b"d0", b"d1"]
    assert values(e, "q", "due") == [b"d2", b"d3", b"d4", b"d5"]
    assert values(e, "q", "delayed")[:3] == [b"l0", b"l1", b"l2"]
    item = e.browse("q", "leased", None, 1).items[0]
    assert item.value is None and item.value_size == 2 and item.lease_expires == now + 5000


def test_browse_skips_released_and_requeued_history(open_engine: Open) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a"), NewItem(b"b"), NewItem(b"c")])
    got = e.dequeue("q", 2)
    e.release("q", [Release(got[0].id, got[0].receipt)])
    assert values(e, "q") == [b"b", b"c"]
    e.freeze("q")
    e.close()
    e2 = open_engine()
    assert values(e2, "q") == [b"b", b"c"]


def test_browse_refuses_a_cursor_of_another_queue_and_bad_input(open_engine: Open) -> None:
    e = open_engine()
    e.enqueue("a", [NewItem(b"1"), NewItem(b"2")])
    e.enqueue("b", [NewItem(b"1")])
    page = e.browse("a", "all", None, 1)
    assert page.next is not None
    with pytest.raises(BadCursor, match="from queue 'a'"):
        e.browse("b", "all", page.next, 1)
    with pytest.raises(BadCursor):
        e.browse("b", "all", "garbage!", 1)
    with pytest.raises(InvalidArgument, match="state"):
        e.browse("a", "weird", None, 1)
    with pytest.raises(InvalidArgument, match="limit"):
        e.browse("a", "all", None, 0)


def test_peek_finds_an_item_wherever_it_is(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    now = clock.now
    ids = [g.id for g in e.enqueue("q", [NewItem(f"v{i}".encode()) for i in range(300)])]
    later = e.enqueue("q", [NewItem(b"later", deadline=now + 60_000)])[0].id
    e.freeze("q")
    e.enqueue("q", [NewItem(b"mem")])
    assert e.peek("q", ids[150]).value == b"v150"
    assert e.peek("q", ids[150]).state == "due"
    p = e.peek("q", later)
    assert (p.state, p.deadline, p.value) == ("delayed", now + 60_000, b"later")
    d = e.dequeue("q", 1, 7000)[0]
    p = e.peek("q", d.id)
    assert (p.state, p.lease_expires, p.stats and p.stats.dequeue_count) == (
        "leased",
        now + 7000,
        1,
    )
    e.release("q", [Release(d.id, d.receipt)])
    assert e.peek("q", d.id).state == "gone"
    with pytest.raises(ItemNotFound, match="ever enqueued"):
        e.peek("q", 10_000)
    with pytest.raises(ItemNotFound):
        e.peek("q", 0)


# ---------------------------------------------------------------- delete / purge


def test_delete_by_id_removes_an_item_durably(open_engine: Open) -> None:
    e = open_engine()
    a, b, _c = (g.id for g in e.enqueue("q", [NewItem(b"a"), NewItem(b"b"), NewItem(b"c")]))
    e.freeze("q")
    e.delete_item("q", b)
    with pytest.raises(ItemNotFound, match="no longer"):
        e.delete_item("q", b)
    assert values(e, "q") == [b"a", b"c"]
    assert e.stats("q").pending == 2
    e.close()
    e = open_engine()
    assert values(e, "q") == [b"a", b"c"]
    d = e.dequeue("q", 1)[0]
    e.delete_item("q", d.id)  # a leased one: its receipt goes stale
    assert e.release("q", [Release(d.id, d.receipt)])[0].error == "stale_receipt"
    assert drain(e, "q") == [b"c"]
    assert a == d.id


def test_purge_removes_everything_and_merges_give_the_space_back(open_engine: Open) -> None:
    e = open_engine(memseg_bytes=16 * 1024)
    for _ in range(5):
        e.enqueue("q", [NewItem(os.urandom(200)) for _ in range(50)])
    e.freeze("q")
    leased = e.dequeue("q", 3)
    before = e.stats("q")
    assert e.purge("q") == 250
    assert e.stats("q").pending == 0 and e.stats("q").leased == 0
    assert e.release("q", [Release(leased[0].id, leased[0].receipt)])[0].error == "stale_receipt"
    assert e.browse("q").items == []
    e.freeze("q")
    q = e.queue("q")
    q.merge(0, len(q.segments))
    assert e.stats("q").bytes_on_disk < before.bytes_on_disk / 10
    e.enqueue("q", [NewItem(b"new")])
    e.close()
    e = open_engine()
    assert drain(e, "q") == [b"new"]


# ---------------------------------------------------------------- idempotent enqueue


def test_keyed_enqueue_writes_once_per_key_and_says_which_were_repeats(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    first = e.enqueue("q", [NewItem(b"a", key="k1"), NewItem(b"b")])
    again = e.enqueue(
        "q",
        [NewItem(b"x", key="k1"), NewItem(b"c", key="k2"), NewItem(b"y", key="k2")],
    )
    assert again[0].id == first[0].id and again[0].duplicate
    assert not again[1].duplicate
    assert again[2].id == again[1].id and again[2].duplicate
    assert values(e, "q") == [b"a", b"b", b"c"]
    clock.advance(300_001)  # the default window is five minutes
    assert not e.enqueue("q", [NewItem(b"z", key="k1")])[0].duplicate


def test_keys_survive_reopen_in_the_log_and_after_freezing_in_a_sidecar(
    open_engine: Open, tmp_path: Path
) -> None:
    e = open_engine()
    a = e.enqueue("q", [NewItem(b"a", key="in-segment")])[0]
    e.freeze("q")
    assert list((tmp_path / "data" / "queues" / "q").glob("*.meta"))
    b = e.enqueue("q", [NewItem(b"b", key="in-log")])[0]
    e.close()
    e = open_engine()
    got = e.enqueue("q", [NewItem(b"x", key="in-segment"), NewItem(b"y", key="in-log")])
    assert [(g.id, g.duplicate) for g in got] == [(a.id, True), (b.id, True)]
    assert values(e, "q") == [b"a", b"b"]


def test_keys_are_checked_and_a_window_of_zero_turns_them_off(open_engine: Open) -> None:
    e = open_engine()
    with pytest.raises(InvalidKey, match="1 to 128"):
        e.enqueue("q", [NewItem(b"a", key="k" * 129)])
    with pytest.raises(InvalidKey):
        e.enqueue("q", [NewItem(b"a", key="")])
    assert "q" not in e.list_queues() or e.stats("q").pending == 0
    e.put_queue("off", QueueConfig(dedup_window_ms=0))
    e.enqueue("off", [NewItem(b"a", key="k")])
    assert not e.enqueue("off", [NewItem(b"a", key="k")])[0].duplicate
    with pytest.raises(InvalidArgument, match="dedup_window_ms"):
        e.put_queue("bad", QueueConfig(dedup_window_ms=-1))


# ---------------------------------------------------------------- dead letters, redrive


def dead_letter(e: Engine, clock: FakeClock, n: int) -> list[int]:
    e.put_queue("jobs", QueueConfig(default_lease_ms=1000, max_deliveries=1))
    ids = [g.id for g in e.enqueue("jobs", [NewItem(f"j{i}".encode()) for i in range(n)])]
    e.dequeue("jobs", n)
    clock.advance(1001)
    assert e.dequeue("jobs", n) == []  # each is over its deliveries: moved
    return ids


def test_redrive_moves_dead_letters_home_with_counts_reset(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    dead_letter(e, clock, 3)
    s = e.stats("jobs")
    assert s.dead_lettered == 3 and s.dead_letter_queue == "jobs.dlq"
    page = e.browse("jobs.dlq")
    assert [i.dead_lettered_from for i in page.items] == ["jobs"] * 3
    e.close()
    e = open_engine()  # origins are durable
    first = e.browse("jobs.dlq").items[0]
    r = e.redrive("jobs.dlq", ids=[first.id, 999, first.id])
    assert (r.moved, r.to) == (1, ["jobs"])
    assert [(f.id, f.error) for f in r.failed] == [(999, "item_not_found")]
    r = e.redrive("jobs.dlq")
    assert (r.moved, r.failed) == (2, [])
    assert e.stats("jobs.dlq").pending == 0
    got = e.dequeue("jobs", 10)
    assert sorted(d.value for d in got) == [b"j0", b"j1", b"j2"]
    assert all(d.stats.dequeue_count == 1 for d in got)  # reset, then this delivery
    assert all(d.stats.requeue_time == clock.now for d in got)


def test_redrive_with_to_and_from_a_queue_that_is_no_dead_letter_queue(
    open_engine: Open, clock: FakeClock
) -> None:
    e = open_engine()
    e.enqueue("plain", [NewItem(b"p")])
    with pytest.raises(NotADeadLetterQueue):
        e.redrive("plain")
    assert e.stats("plain").pending == 1  # nothing changed
    r = e.redrive("plain", to="other", limit=5)
    assert (r.moved, r.to) == (1, ["other"])
    assert drain(e, "other") == [b"p"]
    with pytest.raises(InvalidArgument):
        e.redrive("other", to="other")


def test_stats_show_oldest_lease_age_and_rates(open_engine: Open, clock: FakeClock) -> None:
    e = open_engine()
    e.enqueue("q", [NewItem(b"a"), NewItem(b"b")])
    d = e.dequeue("q", 1, 1000)[0]
    clock.advance(900)
    e.extend("q", [Extend(d.id, d.receipt, 1000)])
    clock.advance(900)
    s = e.stats("q")
    assert s.oldest_lease_age_ms == 1800  # extends do not hide a hung consumer
    assert s.enqueue_per_s == pytest.approx(2 / 60)
    assert s.dequeue_per_s == pytest.approx(1 / 60)
    assert s.release_per_s == 0


def test_delivered_items_in_a_segment_file_do_not_count_as_due(open_engine: Open) -> None:
    """Both items reach a segment file (the queue was idle), both are delivered, one is
    released and one requeued for a minute: nothing is due. The segment's last block was
    counted whole although the dequeue cursor stood on its last key (``dq stats`` then
    showed the delayed item as due; tests/cli's put/get/ack test failed under load)."""
    e = open_engine()
    e.enqueue("q", [NewItem(b"one"), NewItem(b"two")])
    e.freeze("q")
    first, second = e.dequeue("q", count=5)
    e.release("q", [Release(first.id, first.receipt)])
    e.requeue("q", [Requeue(second.id, second.receipt, delay_ms=60_000)])
    stats = e.stats("q")
    assert (stats.segments, stats.pending, stats.due, stats.delayed) == (1, 1, 0, 1)


def test_expired_keys_leave_memory_and_their_sidecars_go(
    open_engine: Open, clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine()
    e.put_queue("q", QueueConfig(dedup_window_ms=1000))
    e.enqueue("q", [NewItem(b"a", key="k")])
    e.freeze("q")
    qdir = tmp_path / "data" / "queues" / "q"
    assert list(qdir.glob("*.meta"))
    q = e.queue("q")
    e.forget_expired_keys(q)
    assert "k" in q.meta.keys and list(qdir.glob("*.meta"))
    clock.advance(61_000)
    e.forget_expired_keys(q)
    assert "k" not in q.meta.keys
    assert not list(qdir.glob("*.meta"))


def test_purge_of_a_stalled_queue_retries_its_failed_rotation(
    open_engine: Open, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log twice over its limit whose rotation failed stalls writes until the rotation
    is tried again; a stalled enqueue asks for that retry, and so must a purge waiting
    for the stall to pass (it looped forever when only a purge was writing)."""
    e = open_engine(fsync="always", memseg_bytes=4096)
    e.enqueue("q", [NewItem(b"a")])
    create = WalWriter.create
    disk_full = [True]
    failures: list[int] = []

    def no_space(*args: Any, **kwargs: Any) -> Any:
        if disk_full[0]:
            failures.append(1)
            raise OSError(errno.ENOSPC, "no space left on device")
        return create(*args, **kwargs)

    monkeypatch.setattr(WalWriter, "create", no_space)
    e.enqueue("q", [NewItem(b"x" * 5000)])  # over the limit: the rotation fails
    e.enqueue("q", [NewItem(b"y" * 5000)])  # twice over: writes stall now
    q = e.queue("q")
    assert failures and q.jobs.stalled()
    with pytest.raises(WriteStall):
        e.enqueue_nowait("q", [NewItem(b"z")])
    disk_full[0] = False  # space again: the next try of the rotation succeeds
    done: list[int] = []
    purging = threading.Thread(target=lambda: done.append(e.purge("q")), daemon=True)
    purging.start()
    purging.join(30)
    assert done == [3] and not q.jobs.stalled()


def test_a_purge_whose_tombstones_overfill_memory_in_one_sync_round_finishes(
    open_engine: Open,
) -> None:
    """With ``always`` a batch's entries reach the in-memory segment at its sync round,
    after the check that asks for a rotation: a purge whose tombstones (200 bytes of
    memory each, 16 in the log) took the segment from under its limit to over twice it
    in one round stalled writes with no rotation asked for, and the purge waited for
    the stall to pass forever."""
    e = open_engine(fsync="always", memseg_bytes=4096)
    for _ in range(60):
        e.enqueue("q", [NewItem(b"v", delay_ms=60_000)])
    q = e.queue("q")
    assert not q.jobs.stalled() and q.stats().pending == 60
    done: list[int] = []
    purging = threading.Thread(target=lambda: done.append(e.purge("q")), daemon=True)
    purging.start()
    purging.join(30)
    assert done == [60] and not q.jobs.stalled()
    e.enqueue("q", [NewItem(b"after")])  # writes go on
    assert [d.value for d in e.dequeue("q", 10)] == [b"after"]


@pytest.mark.parametrize("op", ["peek", "delete"])
def test_peek_and_delete_find_an_item_whose_segment_is_merged_meanwhile(
    open_engine: Open, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """Peek and delete read the segment files outside the queue's lock; a merge that
    swaps them out meanwhile must not make an item that is there look gone."""
    e = open_engine()
    [first] = e.enqueue("q", [NewItem(b"first")])
    e.freeze("q")
    e.enqueue("q", [NewItem(b"second")])
    e.freeze("q")
    q = e.queue("q")
    real = browse.SegmentReader
    merges: list[object] = []

    def merged_first(path: str) -> Any:
        if not merges:  # the files are listed; a merge replaces them before they are read
            merges.append(q.merge(0, len(q.segments)))
        return real(path)

    monkeypatch.setattr(browse, "SegmentReader", merged_first)
    if op == "peek":
        item = e.peek("q", first.id)
        assert (item.state, item.value) == ("due", b"first")
    else:
        e.delete_item("q", first.id)
        assert drain(e, "q") == [b"second"]
    assert merges and [(r.seg_lo, r.seg_hi) for r in q.segments] == [(1, 2)]
