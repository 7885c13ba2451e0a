"""The compiled in-memory segment (``storage/_memseg.c``) driven directly: a Hypothesis
state machine against the simplest model of it (a dict and a sorted list of its keys),
hostile use (keys and stats of other lengths, values of odd sizes and types, counts out
of range, iterators across insertions), and its memory: ``allocated`` is what it holds
from the allocator, and ``ENTRY_MEMORY`` (what rotation by memory counts) covers it."""

from __future__ import annotations

import bisect
import gc
import random
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dq.storage._memseg import ARENA_MAX, ARENA_OWN, LEAF_MAX
from dq.storage.codec import PENDING, TOMBSTONE, encode_key, encode_stats, tombstone_of
from dq.storage.memseg import ENTRY_MEMORY, MemSegment

ST = encode_stats(1, 2, 3)

# Few deadlines and ids, so keys repeat (replays), tombstones meet their pending keys,
# and bounds fall on keys as well as between them.
deadlines = st.integers(0, 40)
ids = st.integers(0, 40)
kinds = st.sampled_from([PENDING, 1, 2, TOMBSTONE])
keys = st.builds(encode_key, deadlines, ids, kinds)
pending_keys = st.builds(encode_key, deadlines, ids, st.sampled_from([PENDING, 1, 2]))
values = st.one_of(
    st.binary(max_size=40),
    st.sampled_from([0, 1, 255, 256, 257, 4095, 4097, ARENA_OWN - 1, ARENA_OWN]).map(
        lambda n: random.Random(n).randbytes(n)
    ),
)
bounds = st.one_of(st.just(b""), keys, st.binary(max_size=20))
groups = st.one_of(st.none(), st.sampled_from(["a", "customer-42", "g" * 128]))


class Model:
    """What a MemSegment promises, in the plainest Python."""

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[bytes, bytes] | None] = {}
        self.keys: list[bytes] = []
        self.groups: dict[bytes, str] = {}
        self.pending = self.tombstones = self.bytes = 0

    def add(self, key: bytes, stats: bytes, value: bytes, group: str | None = None) -> None:
        if key in self.entries:
            return  # a replay: its group too is ignored
        if group is not None and key[15] & 3 != TOMBSTONE:  # a tombstone has no group
            self.groups[key] = group
        bisect.insort(self.keys, key)
        if key[15] & 3 == TOMBSTONE:
            self.entries[key] = None
            self.tombstones += 1
            self.bytes += ENTRY_MEMORY
        else:
            self.entries[key] = (stats, value)
            self.pending += 1
            self.bytes += ENTRY_MEMORY + len(value)

    def kept_tombs_upto(self, key: bytes) -> int:
        return sum(1 for k in self.keys[: bisect.bisect_right(self.keys, key)] if k[15] & 3 == 3)


class MemSegmentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.mem = MemSegment(7)
        self.model = Model()
        self.behind = 0
        self.iters: list[tuple[object, list[bytes], bytes | None]] = []

    @rule(key=keys, value=values, stats=st.binary(min_size=16, max_size=16), group=groups)
    def add(self, key: bytes, value: bytes, stats: bytes, group: str | None) -> None:
        if group is None:
            self.mem.add(key, stats, value)
        else:
            self.mem.add(key, stats, value, group)
        self.model.add(key, stats, value, group)

    @rule(batch=st.lists(st.tuples(pending_keys, values, groups), max_size=30))
    def add_pending(self, batch: list[tuple[bytes, bytes, str | None]]) -> None:
        pairs = [(k, v) for k, v, _g in batch]
        if any(g is not None for _k, _v, g in batch):
            self.mem.add_pending(pairs, ST, [g for _k, _v, g in batch])
        else:
            self.mem.add_pending(pairs, ST)
        for key, value, group in batch:
            self.model.add(key, ST, value, group)

    @rule(start=st.integers(0, 1 << 20), n=st.integers(1, 300), step=st.integers(1, 3))
    def add_run_in_order(self, start: int, n: int, step: int) -> None:
        """Keys in order past everything held: the common case, filling leaves whole."""
        batch = [(encode_key(100 + start + i * step, i), b"%d" % i) for i in range(n)]
        self.mem.add_pending(batch, ST)
        for key, value in batch:
            self.model.add(key, ST, value)

    @rule(n=st.integers(0, 5))
    def add_tombstones_behind(self, n: int) -> None:
        if n == 1:
            self.mem.add_tombstone_behind(b"ignored")
        else:
            self.mem.add_tombstones_behind(n)
        self.behind += n

    @rule(after=bounds)
    def next_after(self, after: bytes) -> None:
        i = bisect.bisect_right(self.model.keys, after)
        want = self.model.keys[i] if i < len(self.model.keys) else None
        assert self.mem.next_after(after) == want
        assert self.mem.next_after(after) == want  # asked again: the remembered answer

    @rule(key=bounds)
    def net_upto(self, key: bytes) -> None:
        m = self.model
        upto = bisect.bisect_right(m.keys, key)
        tombs = m.kept_tombs_upto(key)
        assert self.mem.net_upto(key) == upto - 2 * tombs - self.behind

    @rule(key=st.one_of(keys, st.binary(max_size=20)))
    def lookup(self, key: bytes) -> None:
        assert self.mem.group_of(key) == self.model.groups.get(key)
        want = self.model.entries.get(key)
        assert self.mem.entries.get(key) == want
        assert (key in self.mem.entries) == (key in self.model.entries)
        assert (key in self.mem.keys) == (key in self.model.entries)
        if key in self.model.entries:
            assert self.mem.entries[key] == want
        else:
            with pytest.raises(KeyError):
                self.mem.entries[key]

    @rule(
        lo=st.one_of(st.none(), bounds),
        hi=st.one_of(st.none(), bounds),
        incl=st.tuples(st.booleans(), st.booleans()),
    )
    def irange(self, lo: bytes | None, hi: bytes | None, incl: tuple[bool, bool]) -> None:
        want = [
            k
            for k in self.model.keys
            if (lo is None or (k >= lo if incl[0] else k > lo))
            and (hi is None or (k <= hi if incl[1] else k < hi))
        ]
        assert list(self.mem.keys.irange(minimum=lo, maximum=hi, inclusive=incl)) == want

    @rule(after=bounds)
    def start_iterating(self, after: bytes) -> None:
        """An iterator begun now and stepped after later insertions: it must go on past
        the last key it gave, in order, seeing keys added ahead of it."""
        it = self.mem.keys.irange(minimum=after, inclusive=(False, True))
        self.iters.append((it, [], after))

    @precondition(lambda self: bool(self.iters))
    @rule(steps=st.integers(1, 5))
    def step_iterators(self, steps: int) -> None:
        for it, got, after in self.iters:
            for _ in range(steps):
                k = next(it, None)  # type: ignore[call-overload]
                if k is None:
                    break
                assert after is None or k > after
                if got:
                    assert k > got[-1]
                got.append(k)
                assert k in self.model.entries

    @invariant()
    def counts_agree(self) -> None:
        m = self.model
        assert len(self.mem) == len(m.entries) == len(self.mem.entries) == len(self.mem.keys)
        assert self.mem.pending_count == m.pending
        assert self.mem.tombstone_count == m.tombstones + self.behind
        assert self.mem.net_total == m.pending - m.tombstones - self.behind
        assert self.mem.bytes == m.bytes
        keys = list(self.mem.keys)
        assert self.mem.groups_of(keys) == [m.groups.get(k) for k in keys]
        assert self.mem.grouped == len(m.groups)
        assert sorted(self.mem.group_names) == sorted(set(m.groups.values()))
        assert self.mem.segment_no == 7

    def teardown(self) -> None:
        assert list(self.mem.keys) == self.model.keys
        assert sorted(self.mem.entries) == self.model.keys
        for key in self.model.keys:
            assert self.mem.entries[key] == self.model.entries[key]


TestMemSegmentMachine = MemSegmentMachine.TestCase
TestMemSegmentMachine.settings = settings(max_examples=60, stateful_step_count=60, deadline=None)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 48), st.integers(0, 1 << 40)), max_size=3000))
def test_many_keys_in_any_order_read_back_sorted(pairs: list[tuple[int, int]]) -> None:
    """Enough keys in random order to split leaves many times over."""
    mem = MemSegment(1)
    model: dict[bytes, bytes] = {}
    for d, i in pairs:
        k = encode_key(d, i)
        v = k[::-1][: i % 17]
        mem.add(k, ST, v)
        model.setdefault(k, v)
    assert list(mem.keys) == sorted(model)
    assert all(mem.entries[k] == (ST, v) for k, v in model.items())


def test_a_large_segment_in_random_order() -> None:
    """Many leaves' worth of keys and tombstones, leaves split in the middle, in front and
    behind: every count and search still agrees with a sorted list."""
    rng = random.Random(5)
    mem = MemSegment(1)
    keys = [encode_key(rng.randrange(1 << 48), i) for i in range(40 * LEAF_MAX)]
    keys += [tombstone_of(k) for k in keys[::3]]
    rng.shuffle(keys)
    for k in keys:
        mem.add(k, ST, k[:3])
    want = sorted(keys)
    assert list(mem.keys) == want
    tombs = 0
    for i, k in enumerate(want):
        tombs += k[15] & 3 == TOMBSTONE
        if i % 97 == 0:
            assert mem.next_after(k) == (want[i + 1] if i + 1 < len(want) else None)
            assert mem.net_upto(k) == i + 1 - 2 * tombs
            assert mem.entries[k] == (None if k[15] & 3 == TOMBSTONE else (ST, k[:3]))


# ------------------------------------------------------------------ hostile use


def test_keys_and_stats_of_other_lengths_are_refused_and_change_nothing() -> None:
    mem = MemSegment(1)
    mem.add(encode_key(1, 1), ST, b"a")
    for bad in (b"", b"x" * 15, b"x" * 17, b"x" * 1000):
        with pytest.raises(ValueError, match="16 bytes"):
            mem.add(bad, ST, b"v")
        with pytest.raises(ValueError, match="16 bytes"):
            mem.add_pending([(encode_key(2, 2), b"ok"), (bad, b"v")], ST)
        with pytest.raises(ValueError, match="16 bytes"):
            mem.add(encode_key(3, 3), bad, b"v")
        with pytest.raises(ValueError, match="16 bytes"):
            mem.add_pending([(encode_key(3, 3), b"v")], bad)
        # looking a key of another length up finds nothing, as a dict would
        assert mem.entries.get(bad) is None and bad not in mem.entries
        assert mem.next_after(bad) in (encode_key(1, 1), None)
    assert list(mem.keys) == [encode_key(1, 1)] and mem.pending_count == 1
    assert mem.bytes == ENTRY_MEMORY + 1


def test_values_and_entries_of_wrong_types_are_refused_whole() -> None:
    mem = MemSegment(1)
    key = encode_key(1, 1)
    with pytest.raises(TypeError):
        mem.add(key, ST, None)
    with pytest.raises(TypeError):
        mem.add(key, None, b"v")
    with pytest.raises(TypeError):
        mem.add(key, ST, 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mem.add("0123456789abcdef", ST, b"v")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mem.add_pending([(key, "text")], ST)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        mem.add_pending([(key, b"v", b"extra")], ST)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        mem.add_pending([key], ST)  # type: ignore[list-item]
    with pytest.raises(TypeError):
        mem.add_pending(5, ST)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tombstone"):
        mem.add_pending([(encode_key(2, 2), b"v"), (encode_key(1, 1, TOMBSTONE), b"")], ST)
    with pytest.raises(TypeError):
        mem.add(key, ST)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="group"):
        mem.add(key, ST, b"v", b"bytes-group")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="group"):
        mem.add_pending([(key, b"v")], ST, [7])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="groups for"):
        mem.add_pending([(key, b"v")], ST, ["a", "b"])
    with pytest.raises(TypeError):
        mem.add_pending([(key, b"v")], ST, 7)  # type: ignore[arg-type]
    assert len(mem) == 0 and mem.bytes == 0 and mem.pending_count == 0
    assert mem.grouped == 0 and mem.group_names == ()
    with pytest.raises(TypeError):
        mem.groups_of((key,))  # type: ignore[arg-type]
    assert mem.groups_of([key, "x", None, b"short"]) == [None] * 4  # type: ignore[list-item]
    assert mem.group_of(None) is None and mem.group_of(key) is None
    # bytes-like values other than bytes are copied in and read back as bytes
    mem.add(key, bytearray(ST), memoryview(b"mv"))
    assert mem.entries[key] == (ST, b"mv")
    # a tombstone ignores whatever stats and value it is given
    mem.add(encode_key(1, 1, TOMBSTONE), b"?", 17)  # type: ignore[arg-type]
    assert mem.entries[encode_key(1, 1, TOMBSTONE)] is None


def test_values_of_odd_sizes_read_back_exactly() -> None:
    mem = MemSegment(1)
    sizes = [0, 1, 7, 255, 256, 257, 4096, ARENA_OWN - 1, ARENA_OWN, ARENA_OWN + 1, 1 << 20]
    sizes += [3] * 500 + [300_000, 0, 5]
    rng = random.Random(1)
    want = {}
    for i, n in enumerate(sizes):
        k = encode_key(rng.randrange(1 << 30), i)
        want[k] = rng.randbytes(n)
        mem.add(k, ST, want[k])
    assert all(mem.entries[k] == (ST, v) for k, v in want.items())
    assert mem.bytes == len(sizes) * ENTRY_MEMORY + sum(sizes)


def test_counts_out_of_range_are_refused() -> None:
    mem = MemSegment(1)
    with pytest.raises(ValueError):
        mem.add_tombstones_behind(-1)
    with pytest.raises(OverflowError):
        mem.add_tombstones_behind(1 << 70)
    mem.add_tombstones_behind((1 << 63) - 1)  # a huge count is a count
    assert mem.tombstone_count == (1 << 63) - 1
    with pytest.raises(OverflowError):
        mem.add_tombstones_behind(1)
    with pytest.raises(OverflowError):
        mem.add_tombstone_behind(b"k")
    assert mem.tombstone_count == (1 << 63) - 1
    with pytest.raises(TypeError):
        mem.add_tombstones_behind("3")  # type: ignore[arg-type]
    with pytest.raises(OverflowError):
        MemSegment(1 << 64)
    with pytest.raises(TypeError):
        MemSegment("1")  # type: ignore[arg-type]


def test_bad_bounds_and_lookups() -> None:
    mem = MemSegment(1)
    mem.add(encode_key(1, 1), ST, b"a")
    with pytest.raises(TypeError):
        mem.next_after(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mem.net_upto(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mem.keys.irange(minimum=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        mem.keys.irange(inclusive=(True,))  # type: ignore[arg-type]
    assert mem.entries.get(None) is None and mem.entries.get([1]) is None
    assert mem.entries.get(b"nope", "dflt") == "dflt"
    with pytest.raises(KeyError):
        mem.entries[object()]


def test_attributes_are_read_only_but_replaced_by() -> None:
    mem = MemSegment(4)
    for name in ("segment_no", "bytes", "pending_count", "tombstone_count", "net_total"):
        with pytest.raises(AttributeError):
            setattr(mem, name, 1)
    with pytest.raises(AttributeError):
        mem.other = 1  # type: ignore[attr-defined]
    assert mem.replaced_by is None
    mem.replaced_by = mem  # a cycle the garbage collector can see through
    mem.replaced_by = mem.entries
    del mem
    gc.collect()


def test_views_and_iterators_outlive_their_segment() -> None:
    mem = MemSegment(1)
    mem.add_pending([(encode_key(i, i), b"v") for i in range(10)], ST)
    entries, it = mem.entries, iter(mem.keys)
    del mem
    gc.collect()
    assert next(it) == encode_key(0, 0)
    assert len(list(it)) == 9 and len(entries) == 10
    assert next(it, None) is None  # an ended iterator stays ended


def test_an_iterator_goes_on_past_its_last_key_when_keys_are_added() -> None:
    mem = MemSegment(1)
    mem.add_pending([(encode_key(i * 10, i), b"v") for i in range(1, 6)], ST)
    it = iter(mem.keys)
    assert next(it) == encode_key(10, 1)
    # one key behind the iterator (not given), several ahead of it (given, in order)
    mem.add_pending([(encode_key(i * 10 + 5, 100 + i), b"v") for i in range(6)], ST)
    rest = list(it)
    assert rest == sorted(set(mem.keys) - {encode_key(5, 100), encode_key(10, 1)})
    assert len(rest) == 4 + 5


def test_a_huge_batch_in_one_call() -> None:
    mem = MemSegment(1)
    n = 200_000
    mem.add_pending([(encode_key(5, i), b"") for i in range(n)], ST)
    assert len(mem) == n and mem.bytes == n * ENTRY_MEMORY
    assert mem.net_upto(encode_key(5, n // 2)) == n // 2 + 1
    mem.add_pending([(encode_key(5, i), b"again") for i in range(n)], ST)  # replayed
    assert len(mem) == n and mem.entries[encode_key(5, 7)] == (ST, b"")


# ------------------------------------------------------------------ memory


def _filled(keys: list[bytes], value: bytes) -> MemSegment:
    mem = MemSegment(1)
    for i in range(0, len(keys), 100):
        mem.add_pending([(k, value) for k in keys[i : i + 100]], ST)
    return mem


#: what a segment may hold beyond its entries' share: the unfilled ends of the current
#: value chunk, the last leaf (5 KiB) and the last payload chunk (7 KiB)
FIXED = ARENA_MAX + 16 * 1024


@pytest.mark.parametrize("order", ["in order", "random"])
@pytest.mark.parametrize("size", [0, 16, 100, 1000])
def test_entry_memory_covers_what_an_entry_holds(order: str, size: int) -> None:
    """``bytes`` (ENTRY_MEMORY an entry plus its value) is what rotation by memory
    counts: it must not fall short of the memory really held, whatever the order the
    keys come in, but for a fixed part per segment; and ``allocated`` must be all the
    memory tracemalloc sees."""
    n = 20_000
    keys = [encode_key(1000 + i, i) for i in range(n)]
    if order == "random":
        random.Random(size).shuffle(keys)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    mem = _filled(keys, b"v" * size)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert mem.allocated <= traced <= mem.allocated + 4096  # the object and the views
    assert mem.allocated <= mem.bytes + FIXED
    per_entry = 52 if order == "in order" else ENTRY_MEMORY  # 20-byte slot, 28-byte payload
    assert mem.allocated <= n * (size + per_entry) + FIXED
    assert sys.getsizeof(mem) >= mem.allocated


# ------------------------------------------------------------------ groups


def _names(n: int) -> list[str]:
    """``n`` group names made at run time (as a request's text is): none interned, none
    shared with another test's."""
    return ["-".join(("tenant", str(i), "x" * (i % 7))) for i in range(n)]


def test_many_groups_read_back_each_entry_its_own_name() -> None:
    """Thousands of names through many growths of the name table, each entry given its
    own copy of its name's text, keys in random order and replayed with other names:
    every entry reads back the name it was given, each name is held once."""
    rng = random.Random(3)
    names = _names(5000)
    n = 30_000
    keys = [encode_key(rng.randrange(1 << 40), i) for i in range(n)]
    want: dict[bytes, str | None] = {}
    mem = MemSegment(9)
    for i, k in enumerate(keys):
        g = None if i % 5 == 0 else names[rng.randrange(len(names))]
        copy = None if g is None else "".join(list(g))  # equal text, another object
        if i % 2:
            mem.add_pending([(k, b"v%d" % i)], ST, [copy])
        else:
            mem.add(k, ST, b"v%d" % i, copy)
        want[k] = g
    for k in keys[::3]:  # replayed with another group: ignored, as the entry is
        mem.add(k, ST, b"again", "someone-else")
        mem.add_pending([(k, b"again")], ST, ["someone-else"])
    # a tombstone ignores its group; a str subclass is kept as its plain text
    mem.add(tombstone_of(keys[1]), None, None, "tomb-group")

    class Name(str):
        pass

    sub = encode_key(1 << 41, 1)
    mem.add(sub, ST, b"s", Name(names[7]))
    want[sub] = names[7]

    ordered = list(mem.keys)
    assert mem.groups_of(ordered) == [want.get(k) for k in ordered]  # in order: steps
    shuffled = ordered[:]
    rng.shuffle(shuffled)
    assert mem.groups_of(shuffled) == [want.get(k) for k in shuffled]  # searched each
    assert all(mem.group_of(k) == g for k, g in want.items())
    assert mem.group_of(tombstone_of(keys[1])) is None
    used = {g for g in want.values() if g is not None}
    assert len(mem.group_names) == len(used) and set(mem.group_names) == used
    assert "someone-else" not in used and "tomb-group" not in mem.group_names
    assert all(type(g) is str for g in mem.group_names)
    assert mem.grouped == sum(g is not None for g in want.values())
    # one object per name: every entry of a group reads back the same string
    by_name = {g: g for g in mem.group_names}
    assert all(mem.group_of(k) is by_name[g] for k, g in want.items() if g is not None)


def test_a_segment_holds_each_name_once_and_lets_go_of_it() -> None:
    """The names' reference counts: one more while a segment holds them (whatever the
    number of entries that use them or the copies they came as), the same as before
    once it is gone. And the memory of a grouped segment: 4 bytes an entry and a few
    dozen a name beyond the ungrouped entries, all of it in ``allocated``."""
    names = _names(2000)
    n = 40_000
    keys = [encode_key(1000 + i, i) for i in range(n)]
    grouped = [names[i % len(names)] for i in range(n)]
    counts = [sys.getrefcount(g) for g in names]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    mem = MemSegment(1)
    for i in range(0, n, 100):
        mem.add_pending([(k, b"v") for k in keys[i : i + 100]], ST, grouped[i : i + 100])
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert [sys.getrefcount(g) for g in names] == [c + 1 for c in counts]
    assert mem.group_names == tuple(names)
    plain = _filled(keys, b"v")
    assert mem.allocated <= traced <= mem.allocated + 4096
    assert mem.allocated - plain.allocated <= n * 4 + len(names) * 32 + 8192
    assert mem.groups_of(keys) == grouped
    del mem
    gc.collect()
    assert [sys.getrefcount(g) for g in names] == counts
