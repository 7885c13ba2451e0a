"""A queue's due, delayed and oldest-due figures are exact wherever its items live: in
the log, in segment files of many blocks, after a restart, as time passes, with
tombstones in other segment files, and after merges.

Each figure is checked against numbers the test knows, and against ``browse`` (which
looks at every item) in a random run of every operation.
"""

from __future__ import annotations

import bisect
import logging
import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine, NewItem, Release, Requeue
from dq.storage.codec import TOMBSTONE, encode_key, encode_pending, encode_stats, key_deadline
from dq.storage.segment import SegmentReader, write_segment
from tests.storage.conftest import FakeClock

HOUR = 3_600_000
#: values this long put ~60 entries in a 64 KiB block: a few thousand items make
#: segment files of dozens of blocks
VALUE = b"v" * 1000

Opener = Callable[..., Engine]


def counts(engine: Engine, queue: str = "q") -> tuple[int, int, int, int]:
    s = engine.stats(queue)
    return s.pending, s.due, s.delayed, s.leased


def browsed(engine: Engine, queue: str = "q") -> tuple[int, int, int, int]:
    """(pending, due, delayed, leased) from every item, one page at a time."""
    seen = {"due": 0, "delayed": 0, "leased": 0}
    cursor: str | None = None
    while True:
        page = engine.browse(queue, "all", cursor, limit=1000)
        for item in page.items:
            seen[item.state] += 1
        if page.next is None:
            break
        cursor = page.next
    return sum(seen.values()), seen["due"], seen["delayed"], seen["leased"]


def restart(open_engine: Opener, engine: Engine) -> Engine:
    """Close ``engine`` and open its directory again, every log frozen into a segment
    file (as a server does in the background after it starts)."""
    engine.close()
    again = open_engine()
    for name in again.list_queues():
        again.freeze(name)
    return again


def segment_files(engine: Engine, queue: str = "q") -> int:
    return engine.stats(queue).segments


def test_a_restart_keeps_one_due_and_one_delayed_apart(
    open_engine: Opener, clock: FakeClock
) -> None:
    engine = open_engine()
    engine.enqueue("q", [NewItem(b"now"), NewItem(b"later", delay_ms=HOUR)])
    assert counts(engine) == (2, 1, 1, 0)
    engine = restart(open_engine, engine)
    assert segment_files(engine) == 1  # both in one block of one segment file
    assert counts(engine) == (2, 1, 1, 0)
    s = engine.stats("q")
    assert s.oldest_due_age_ms == 0
    clock.advance(HOUR)
    assert counts(engine) == (2, 2, 0, 0)
    assert engine.stats("q").oldest_due_age_ms == HOUR


def test_many_delayed_items_across_blocks_become_due_one_by_one(
    open_engine: Opener, clock: FakeClock
) -> None:
    """3,000 items a second apart in a segment file of ~50 blocks: at every step of the
    clock exactly the items whose deadline passed are due, without a restart."""
    engine = open_engine()
    start = clock.now
    deadlines = [start + 1000 * i for i in range(-1000, 2000)]
    for lo in range(0, len(deadlines), 500):
        engine.enqueue("q", [NewItem(VALUE, deadline=d) for d in deadlines[lo : lo + 500]])
    engine.freeze("q")
    reader = engine.queue("q").segments[0]
    assert len(reader.first_keys) > 40
    for step in [0, 1, 999, 1000, 1001, 65_432, 400_000, 999_999, 1_000_000, 1_998_999]:
        clock.now = start + step
        due = sum(1 for d in deadlines if d <= clock.now)
        assert counts(engine) == (3000, due, 3000 - due, 0), step
        oldest = engine.stats("q").oldest_due_age_ms
        assert oldest == clock.now - deadlines[0]
    engine = restart(open_engine, engine)
    assert counts(engine) == browsed(engine) == (3000, 2999, 1, 0)


def test_the_boundary_inside_one_block_moves_with_the_clock(
    open_engine: Opener, clock: FakeClock
) -> None:
    """Deadlines a millisecond apart, several items each, all in one block: the count
    follows the clock item by item."""
    engine = open_engine()
    start = clock.now
    deadlines = [start + ms for ms in range(-20, 21) for _ in range(3)]
    engine.enqueue("q", [NewItem(b"x", deadline=d) for d in deadlines])
    engine.freeze("q")
    assert len(engine.queue("q").segments[0].first_keys) == 1
    for ms in range(-25, 26):
        clock.now = start + ms
        due = sum(1 for d in deadlines if d <= clock.now)
        assert counts(engine) == (len(deadlines), due, len(deadlines) - due, 0), ms
    engine = restart(open_engine, engine)
    clock.now = start
    assert counts(engine) == (123, 63, 60, 0)


def test_tombstones_in_other_segment_files_cancel_what_they_count(
    open_engine: Opener, clock: FakeClock
) -> None:
    """Released, requeued and deleted items leave pending entries in one segment file
    and tombstones in others: after a restart (the cursor back at the start, every
    tombstone ahead of it) none of them counts, due or delayed."""
    engine = open_engine()
    now = clock.now
    engine.enqueue("q", [NewItem(VALUE, deadline=now - 10_000 + i) for i in range(600)])
    engine.enqueue("q", [NewItem(VALUE, deadline=now + HOUR + i) for i in range(600)])
    engine.freeze("q")
    got = engine.dequeue("q", 400, lease_ms=60_000)
    engine.release("q", [Release(d.id, d.receipt) for d in got[:300]])
    # 50 back due later, 50 due at once (behind the cursor's deadline: placed after it)
    engine.requeue("q", [Requeue(d.id, d.receipt, delay_ms=2 * HOUR) for d in got[300:350]])
    engine.requeue("q", [Requeue(d.id, d.receipt, delay_ms=0) for d in got[350:]])
    delayed_ids = [i.id for i in engine.browse("q", "delayed", None, limit=20).items]
    for item_id in delayed_ids:
        engine.delete_item("q", item_id)  # tombstones ahead of the cursor
    expected = (1200 - 300 - 20, 600 - 400 + 50, 600 - 20 + 50, 0)
    assert counts(engine) == browsed(engine) == expected
    engine.freeze("q")
    assert segment_files(engine) == 2
    assert counts(engine) == browsed(engine) == expected
    engine = restart(open_engine, engine)
    assert counts(engine) == browsed(engine) == expected
    # the oldest due item is the oldest never delivered, not a released one before it
    assert engine.stats("q").oldest_due_age_ms == 10_000 - 400


def test_counts_stay_exact_through_merges(open_engine: Opener, clock: FakeClock) -> None:
    engine = open_engine()
    rng = random.Random(5)
    for _ in range(4):
        engine.enqueue(
            "q",
            [NewItem(VALUE, deadline=clock.now + rng.randint(-HOUR, HOUR)) for _ in range(300)],
        )
        got = engine.dequeue("q", 100, lease_ms=60_000)
        engine.release("q", [Release(d.id, d.receipt) for d in got[:70]])
        engine.requeue("q", [Requeue(d.id, d.receipt, delay_ms=HOUR // 2) for d in got[70:]])
        engine.freeze("q")
    engine = restart(open_engine, engine)
    before = browsed(engine)
    assert before[0] == 4 * (300 - 70) and before[1] > 0 and before[2] > 0
    assert counts(engine) == before
    q = engine.queue("q")
    q.merge(1, 3)  # the middle two: rogue tombstones kept
    assert segment_files(engine) == 3
    assert counts(engine) == before
    q.merge(0, len(q.segments))  # everything: pairs cancelled, rogue tombstones dropped
    assert segment_files(engine) == 1
    assert counts(engine) == before
    clock.advance(HOUR // 3)
    assert counts(engine) == browsed(engine)


def test_a_random_run_always_counts_what_browse_sees(open_engine: Opener, clock: FakeClock) -> None:
    """Every operation in random order; after each step stats and browse agree, and
    pending is due + delayed + leased."""
    engine = open_engine()
    engine.ensure_queue("q")
    rng = random.Random(11)
    leased: dict[int, tuple[str, int]] = {}  # id -> (receipt, lease expiry)
    for step in range(200):
        op = rng.random()
        if op < 0.3:
            engine.enqueue(
                "q",
                [
                    NewItem(
                        b"x" * rng.randint(1, 3000),
                        deadline=clock.now + rng.randint(-60_000, 120_000),
                    )
                    for _ in range(rng.randint(1, 40))
                ],
            )
        elif op < 0.45:
            for d in engine.dequeue("q", rng.randint(1, 20), lease_ms=rng.randint(1, 60_000)):
                leased[d.id] = (d.receipt, d.lease_expires)
        elif op < 0.6 and leased:
            ids = rng.sample(sorted(leased), min(len(leased), rng.randint(1, 10)))
            engine.release("q", [Release(i, leased.pop(i)[0]) for i in ids])
        elif op < 0.7 and leased:
            ids = rng.sample(sorted(leased), min(len(leased), rng.randint(1, 10)))
            engine.requeue(
                "q",
                [Requeue(i, leased.pop(i)[0], delay_ms=rng.randint(0, 90_000)) for i in ids],
            )
        elif op < 0.75:
            items = engine.browse("q", "all", None, limit=50).items
            waiting = [i for i in items if i.state != "leased"]
            if waiting:
                engine.delete_item("q", rng.choice(waiting).id)
        elif op < 0.82:
            engine.freeze("q")
        elif op < 0.86:
            q = engine.queue("q")
            if len(q.segments) >= 2:
                start = rng.randrange(len(q.segments) - 1)
                q.merge(start, rng.randint(start + 1, len(q.segments)))
        elif op < 0.89:
            engine = restart(open_engine, engine)
            leased.clear()
        else:
            clock.advance(rng.randint(1, 30_000))
            engine.expire_leases("q")
            leased = {i: lease for i, lease in leased.items() if lease[1] > clock.now}
        stats = engine.stats("q")
        assert counts(engine) == browsed(engine), step
        assert stats.pending == stats.due + stats.delayed + stats.leased, step
        due = engine.browse("q", "due", None, limit=1).items
        expected_age = clock.now - due[0].deadline if due else None
        assert stats.oldest_due_age_ms == expected_age, step


def test_a_damaged_block_does_not_fail_the_stats(
    open_engine: Opener, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Bytes of a block that fail its checksum (found by no step of the start): stats
    still answer, every queue's listing and /metrics read them, counting that file to
    within a block, and the damage is logged naming the file."""
    engine = open_engine()
    start = clock.now
    engine.enqueue("q", [NewItem(VALUE, deadline=start + i) for i in range(1000)])
    engine.freeze("q")
    reader = engine.queue("q").segments[0]
    path, middle = reader.path, len(reader.first_keys) // 2
    due_then = key_deadline(reader.first_keys[middle]) + 5 - start  # items 0..due_then
    offset, length, _crc = reader._rows[middle]
    engine.close()
    with open(path, "r+b") as f:
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    engine = open_engine()
    clock.now = start + due_then  # now falls in the damaged block
    with caplog.at_level(logging.ERROR, logger="dq.storage.segment_counts"):
        pending, due, delayed, leased = counts(engine)
        counts(engine)
    assert (pending, leased) == (1000, 0) and due + delayed == 1000
    assert abs(due - (due_then + 1)) <= max(reader.block_entries)
    damage = [r for r in caplog.records if path in r.getMessage()]
    assert len(damage) == 1, caplog.records


def test_a_segment_file_counts_exactly_below_any_key(tmp_path: Path) -> None:
    """``SegmentCounts.net_upto`` against a count of every entry, for keys asked in a
    random order (boundaries learned from either end, remembered answers reused and
    crossed) in files of pendings and tombstones mixed, of pendings only, of
    tombstones only."""
    rng = random.Random(2)
    for kind in ("mixed", "pending", "tombstones"):
        entries: list[tuple[bytes, bytes]] = []
        for i in range(25_000 if kind == "tombstones" else 3000):
            deadline = 1_800_000_000_000 + rng.randint(0, 500) * 7
            tomb = kind == "tombstones" or (kind == "mixed" and rng.random() < 0.3)
            key = encode_key(deadline, i + 1, TOMBSTONE if tomb else 0)
            value = b"" if tomb else b"x" * rng.randint(0, 400)
            entries.append(
                (key, key if tomb else encode_pending(key, encode_stats(1, 0, 0), value))
            )
        entries.sort()
        path = tmp_path / f"{kind}.seg"
        write_segment(str(path), entries, seg_lo=1, seg_hi=1, max_id=len(entries))
        reader = SegmentReader(str(path))
        try:
            assert len(reader.first_keys) > 5
            keys = [k for k, _ in entries]
            net = [0]  # net[i]: pendings minus tombstones among the first i entries
            for k in keys:
                net.append(net[-1] + (-1 if k[15] & 3 == TOMBSTONE else 1))
            probes = [k for k in rng.sample(keys, 300)] + [b"", b"\xff" * 16]
            probes += [
                encode_key(1_800_000_000_000 + rng.randint(-10, 3600), rng.randint(0, 4000))
                for _ in range(300)
            ]
            for probe in probes:
                expected = net[bisect.bisect_right(keys, probe)]
                assert reader.counts.net_upto(probe) == expected, (kind, probe.hex())
        finally:
            reader.close()


def _mixed_file(path: Path, rng: random.Random, n: int = 6000) -> list[bytes]:
    """A segment file of pendings and tombstones mixed; its keys."""
    entries: list[tuple[bytes, bytes]] = []
    for i in range(n):
        key = encode_key(1_800_000_000_000 + rng.randint(0, 500) * 7, i + 1, 0)
        if rng.random() < 0.3:
            key = key[:15] + bytes([key[15] | TOMBSTONE])
            entries.append((key, key))
        else:
            value = b"x" * rng.randint(0, 400)
            entries.append((key, encode_pending(key, encode_stats(1, 0, 0), value)))
    entries.sort()
    write_segment(str(path), entries, seg_lo=1, seg_hi=1, max_id=n)
    return [k for k, _ in entries]


def test_learning_leaves_the_count_nothing_to_decode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SegmentCounts.learn`` (what a stats call runs without the queue's lock) decodes,
    through a handle of its own, every block a count at its probes needs: the count then
    reads nothing through the queue's reader, and is exact. Keys it was not told of are
    counted as before."""
    rng = random.Random(3)
    keys = _mixed_file(tmp_path / "1-1.seg", rng)
    net = [0]
    for k in keys:
        net.append(net[-1] + (-1 if k[15] & 3 == TOMBSTONE else 1))
    for _ in range(5):
        reader = SegmentReader(str(tmp_path / "1-1.seg"))
        try:
            assert len(reader.first_keys) > 12
            probes = rng.sample(keys, 3)
            reader.counts.learn(probes)

            def no_read(i: int) -> bytes:
                raise AssertionError(f"block {i} read under the queue's lock")

            with monkeypatch.context() as m:
                m.setattr(reader, "read_raw", no_read)
                for probe in probes:
                    assert reader.counts.net_upto(probe) == net[bisect.bisect_right(keys, probe)]
            for probe in rng.sample(keys, 50):  # the rest learned under the lock, as before
                assert reader.counts.net_upto(probe) == net[bisect.bisect_right(keys, probe)]
        finally:
            reader.close()


def test_a_file_gone_or_replaced_before_learning_is_counted_as_before(tmp_path: Path) -> None:
    """A segment file merged away (deleted) before ``learn`` opens it, or another file
    in its place: nothing is learned from it, and the count reads its own reader."""
    rng = random.Random(4)
    path = tmp_path / "1-1.seg"
    keys = _mixed_file(path, rng)
    net = [0]
    for k in keys:
        net.append(net[-1] + (-1 if k[15] & 3 == TOMBSTONE else 1))
    probes = rng.sample(keys, 3)
    for replace in (False, True):
        reader = SegmentReader(str(path))
        try:
            os.unlink(path)
            if replace:
                _mixed_file(path, random.Random(99))
            reader.counts.learn(probes)
            assert reader.counts._unknown == len(reader.first_keys)  # nothing learned
            for probe in probes:
                assert reader.counts.net_upto(probe) == net[bisect.bisect_right(keys, probe)]
        finally:
            reader.close()
        if not replace:
            _mixed_file(path, random.Random(4))  # the same file again, for the next round
