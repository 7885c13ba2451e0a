"""``MoveFrames``, the records that move items, read back from the log byte by byte: a
requeue writes the item's new pending entry and the tombstone of the one it leaves in
one record; a failed item's record carries its key and its reasons; a pending item
moved by its key to the deadline it has takes a key 1 ms later (one log holds a key
once). The expected bytes are built from the format's own encoders (``docs/storage.md``,
``docs/itemmeta.md``), not copied from a run."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dq.storage import Engine, Fail, NewItem, QueueConfig, Requeue, RetryPolicy
from dq.storage.codec import PENDING_HEADER, encode_key, encode_stats, tombstone_of
from dq.storage.itemmeta import encode_key_entry
from dq.storage.reasons import Reason, encode_error_entry
from dq.storage.wal import frame_record, read_wal, record_body
from tests.storage.conftest import FakeClock
from tests.storage.held_sync import gated_syncs

Q = "moves"
Open = Callable[..., Engine]


def _record(entries: bytes, meta: bytes = b"") -> bytes:
    """A record of ``entries`` and ``meta`` as the log holds it, framed (``docs/format.md``)."""
    kind, body = record_body(entries, meta)
    return frame_record(body, kind)


def _log_tail(tmp_path: Path, n: int) -> bytes:
    """The last ``n`` bytes the queue's log holds (its preallocated zeros left out)."""
    [log] = sorted((tmp_path / "data").rglob("*.log"))
    end = read_wal(str(log)).valid_end
    return log.read_bytes()[:end][-n:]


def _pending(deadline: int, item_id: int, stats: bytes, value: bytes) -> bytes:
    return PENDING_HEADER.pack(encode_key(deadline, item_id), stats, len(value)) + value


def test_a_requeue_is_one_record_of_the_new_entry_and_the_old_ones_tombstone(
    open_engine: Open, clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(fsync="always")
    e.put_queue(Q, QueueConfig())
    enqueued_at = clock.now
    [done] = e.enqueue(Q, [NewItem(b"hello")])
    clock.advance(10)
    [d] = e.dequeue(Q, 1, 1000)
    later = clock.now + 5000
    [out] = e.requeue(Q, [Requeue(d.id, d.receipt, deadline=later)])
    assert (out.id, out.deadline) == (d.id, later)
    stats = encode_stats(enqueued_at, clock.now, 1)
    old = encode_key(done.deadline, done.id)
    expected = _record(_pending(later, d.id, stats, b"hello") + tombstone_of(old))
    assert _log_tail(tmp_path, len(expected)) == expected


def test_a_failed_items_record_carries_its_key_and_its_reasons(
    open_engine: Open, clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(fsync="always")
    e.put_queue(Q, QueueConfig(retry=RetryPolicy(delays_ms=(2000,))))
    enqueued_at = clock.now
    [done] = e.enqueue(Q, [NewItem(b"order 7", key="order-7")])
    clock.advance(10)
    [d] = e.dequeue(Q, 1, 1000)
    [out] = e.fail(Q, [Fail(d.id, d.receipt, "card declined")])
    assert out.deadline == clock.now + 2000
    stats = encode_stats(enqueued_at, clock.now, 1)
    old = encode_key(done.deadline, done.id)
    why = (Reason("card declined", clock.now, 1),)
    expected = _record(
        _pending(out.deadline, d.id, stats, b"order 7") + tombstone_of(old),
        encode_key_entry(d.id, out.deadline, enqueued_at, b"order-7")
        + encode_error_entry(d.id, out.deadline, why),
    )
    assert _log_tail(tmp_path, len(expected)) == expected


def test_an_item_moved_by_its_key_to_its_own_deadline_takes_the_next_millisecond(
    open_engine: Open, clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(fsync="always")
    e.put_queue(Q, QueueConfig(dedup_window_ms=3600_000))
    enqueued_at = clock.now
    due = clock.now + 60_000
    [first] = e.enqueue(Q, [NewItem(b"v1", deadline=due, key="digest")])
    clock.advance(10)
    [moved] = e.enqueue(Q, [NewItem(b"v2", deadline=due, key="digest", on_duplicate="replace")])
    assert (moved.id, moved.deadline, moved.replaced) == (first.id, due + 1, True)
    stats = encode_stats(enqueued_at, clock.now, 0)
    expected = _record(
        _pending(due + 1, first.id, stats, b"v2") + tombstone_of(encode_key(due, first.id)),
        encode_key_entry(first.id, due + 1, clock.now, b"digest"),
    )
    assert _log_tail(tmp_path, len(expected)) == expected
    clock.advance(60_000)
    [d] = e.dequeue(Q, 5, 1000)  # one item, the new value
    assert (d.id, d.value) == (first.id, b"v2")
    assert e.dequeue(Q, 5, 1000) == []


def test_an_item_moved_by_its_key_while_its_enqueue_is_synced_keeps_its_group(
    open_engine: Open, clock: FakeClock
) -> None:
    """The item's group is read from the write still on its way to disk when the item is
    not in a segment yet (``MoveFrames.group_in_flight``): its new entry keeps it, after
    a restart too."""
    e = open_engine(fsync="always")
    e.put_queue(Q, QueueConfig(dedup_window_ms=60_000, group_limit=1))
    now = clock.now
    with ThreadPoolExecutor(1) as pool, gated_syncs() as gate:
        first = e.enqueue_nowait(Q, [NewItem(b"v", now + 5000, key="k", group="g")])
        assert gate.wait_arrived(1), "the enqueue never synced its log"
        moved = pool.submit(e.patch_key, Q, "k", deadline=now + 9000)
        waiting = e.queue(Q).commit.waiting  # the move's record appended behind it
        give_up = time.monotonic() + 10
        while len(waiting) < 2 and not moved.done() and time.monotonic() < give_up:
            time.sleep(0.005)
        assert len(waiting) == 2, "the move was not written while the enqueue was synced"
        gate.open()
        [put] = first.result(10)
        done = moved.result(10)
    assert (done.id, done.deadline) == (put.id, now + 9000)
    assert e.peek_key(Q, "k").group == "g"
    e.close()
    assert open_engine(fsync="always").peek_key(Q, "k").group == "g"
