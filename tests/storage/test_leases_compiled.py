"""The compiled in-flight set (``storage/_leases.c``) driven directly: a Hypothesis state
machine against the plainest model of a lease's rules (a dict of live deliveries, the
receipt check as the Python engine wrote it), hostile receipts and calls, the
references it holds (sources and group names, cycles through them collected), and its
memory: ``allocated`` is what tracemalloc sees, a lease costs its record, its slot and
its two heap places, and ended leases give their room back."""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref
from dataclasses import dataclass

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dq.storage._leases import KEY, RECORD, Lease, Leases
from dq.storage.codec import encode_key
from dq.storage.errors import InvalidReceipt, ItemNotFound, StaleReceipt, StorageError

T0 = 1_800_000_000_000
GROUPS = [None, "a", "b", "customer-42"]


@dataclass
class Model:
    """One live delivery as the model keeps it."""

    key: bytes
    stats: tuple[int, int, int]
    expires: int
    delivery: int
    since: int
    source: object | None
    group: str | None


def model_check(
    epoch: str, live: dict[int, Model], item_id: object, receipt: object, next_id: int, now: int
) -> Model:
    """The receipt rule as the Python engine wrote it (``docs/http.md``: the errors and
    their order): what the compiled check must agree with for any input."""
    parts = receipt.split(".") if isinstance(receipt, str) else []
    try:
        if len(parts) != 3:
            raise ValueError
        e, rid, delivery = parts[0], int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        raise InvalidReceipt("malformed receipt", id=item_id, receipt=receipt) from None
    if rid != item_id:
        raise InvalidReceipt("receipt is for another item", id=item_id, receipt=receipt)
    assert isinstance(item_id, int)
    if item_id >= next_id or item_id <= 0:
        raise ItemNotFound("no item with this id was ever enqueued here", id=item_id)
    lease = live.get(item_id)
    if e != epoch or lease is None or lease.delivery != delivery or lease.expires <= now:
        raise StaleReceipt(
            "that delivery is over (released, requeued, expired, or the server restarted)",
            id=item_id,
        )
    return lease


def outcome(call: object) -> tuple[str, str] | Lease:
    """A call's lease, or its error's code and message."""
    try:
        return call()  # type: ignore[operator,no-any-return]
    except StorageError as exc:
        return exc.code, str(exc)


def same(lease: Lease, m: Model) -> bool:
    return (
        lease.key,
        (lease.enqueue_time, lease.requeue_time, lease.dequeue_count),
        lease.expires,
        lease.delivery,
        lease.since,
        lease.source,
        lease.group,
    ) == (m.key, m.stats, m.expires, m.delivery, m.since, m.source, m.group)


def receipt_of(epoch: str, item_id: int, delivery: int) -> str:
    return f"{epoch}.{item_id:x}.{delivery:x}"


#: receipts in shapes int(…, 16) reads in its own way, and others no receipt has
def odd_receipts(epoch: str, item_id: int, delivery: int) -> st.SearchStrategy[str]:
    i, d = f"{item_id:x}", f"{delivery:x}"
    shapes = [
        f"{epoch}.{i.upper()}.{d}",
        f"{epoch}.0x{i}.{d}",
        f"{epoch}. {i} .{d}\n",
        f"{epoch}.+{i}.{d}",
        f"{epoch}.-{i}.{d}",
        f"{epoch}.{i}.-{d}",
        f"{epoch}.{'0' * 20}{i}.{d}",
        f"{epoch}.{i}.{'0' * 20}{d}",
        f"{epoch}.{i}.1{'0' * 20}",
        f"{epoch}.1{'0' * 20}.{d}",
        f"{epoch}.{i[:1]}_{i[1:]}.{d}" if len(i) > 1 else f"{epoch}.{i}_.{d}",
        f"{epoch}.{i}.{d}.",
        f"{epoch}..{d}",
        f"{epoch}.{i}.",
        f".{i}.{d}",
        f"{epoch}x.{i}.{d}",
        f"{epoch[:-1]}.{i}.{d}",
        f"{epoch}.{i}",
        f"{epoch}.{i}.{d}g",
        f"{epoch}.\u0661.{d}",  # an Arabic-Indic one: int() reads it
        f"{epoch}.{i}.\uff11",  # a fullwidth one
        "",
        "...",
    ]
    return st.sampled_from(shapes) | st.text(max_size=40) | st.from_regex(r"[0-9a-f.]{0,30}")


class LeasesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.leases = Leases()
        self.epoch = self.leases.epoch
        self.live: dict[int, Model] = {}
        self.taken: list[tuple[int, Lease]] = []
        self.deliveries = 0
        self.next_id = 1
        self.now = T0
        self.sources = [object(), None, "segment"]

    # ---------------------------------------------------------------- leasing

    @rule(
        lease_ms=st.integers(1, 5000),
        stats=st.tuples(st.integers(0, 2**48 - 1), st.integers(0, 2**48 - 1), st.integers(1, 9)),
        source=st.integers(0, 2),
        group=st.sampled_from(GROUPS),
        skip=st.integers(0, 3),
    )
    def add(
        self, lease_ms: int, stats: tuple[int, int, int], source: int, group: str | None, skip: int
    ) -> None:
        item_id = self.next_id + skip
        self.next_id = item_id + 1
        key = encode_key(self.now, item_id)
        src = self.sources[source]
        got = self.leases.add(item_id, key, *stats, self.now + lease_ms, src, self.now, group)
        self.deliveries += 1
        assert got == receipt_of(self.epoch, item_id, self.deliveries)
        self.live[item_id] = Model(
            key, stats, self.now + lease_ms, self.deliveries, self.now, src, group
        )

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def add_again_is_refused(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.live)))
        with pytest.raises(ValueError):
            self.leases.add(item_id, encode_key(1, item_id), 0, 0, 1, self.now + 9, None, 0, None)

    @rule(step=st.integers(-50, 3000))
    def clock(self, step: int) -> None:
        self.now += step  # a wall clock can step back

    # ---------------------------------------------------------------- receipts

    def _pick(self, data: st.DataObject) -> tuple[int, str]:
        """An id and a receipt: a live one, an ended one, or any string at all."""
        ids = sorted(self.live) or [1]
        item_id = data.draw(st.sampled_from(ids) | st.integers(-3, self.next_id + 3))
        m = self.live.get(item_id)
        d = m.delivery if m is not None else data.draw(st.integers(0, self.deliveries + 1))
        good = receipt_of(self.epoch, item_id, d)
        receipt = data.draw(
            st.just(good)
            | st.just(receipt_of("0" * 8, item_id, d))
            | st.just(receipt_of(self.epoch, item_id + 1, d))
            | odd_receipts(self.epoch, max(item_id, 0), d)
        )
        return item_id, receipt

    @rule(data=st.data())
    def check(self, data: st.DataObject) -> None:
        item_id, receipt = self._pick(data)
        want = outcome(
            lambda: model_check(self.epoch, self.live, item_id, receipt, self.next_id, self.now)
        )
        got = outcome(lambda: self.leases.check(item_id, receipt, self.next_id, self.now))
        if isinstance(want, Model):
            assert isinstance(got, Lease) and same(got, want)
        else:
            assert got == want

    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        item_id, receipt = self._pick(data)
        want = outcome(
            lambda: model_check(self.epoch, self.live, item_id, receipt, self.next_id, self.now)
        )
        got = outcome(lambda: self.leases.take(item_id, receipt, self.next_id, self.now))
        if isinstance(want, Model):
            assert isinstance(got, Lease) and same(got, want)
            del self.live[item_id]
            self.taken.append((item_id, got))
        else:
            assert got == want

    @rule(data=st.data(), lease_ms=st.integers(1, 5000))
    def extend(self, data: st.DataObject, lease_ms: int) -> None:
        item_id, receipt = self._pick(data)
        want = outcome(
            lambda: model_check(self.epoch, self.live, item_id, receipt, self.next_id, self.now)
        )
        got = outcome(
            lambda: self.leases.extend(
                item_id, receipt, self.next_id, self.now, self.now + lease_ms
            )
        )
        if isinstance(want, Model):
            assert got == receipt_of(self.epoch, item_id, want.delivery)
            want.expires = self.now + lease_ms  # shorter or longer; since stays
        else:
            assert got == want

    # ---------------------------------------------------------------- ends

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def pop(self, data: st.DataObject) -> None:
        item_id = data.draw(st.sampled_from(sorted(self.live)))
        lease = self.leases.pop(item_id)
        assert same(lease, self.live.pop(item_id))
        self.taken.append((item_id, lease))

    @rule(item_id=st.integers(-2, 50))
    def pop_unknown(self, item_id: int) -> None:
        if item_id not in self.live:
            with pytest.raises((KeyError, OverflowError)):
                self.leases.pop(item_id)

    @rule()
    def pop_expired(self) -> None:
        got = self.leases.pop_expired(self.now)
        want = sorted((m.expires, i) for i, m in self.live.items() if m.expires <= self.now)
        assert [(lease.expires, i) for i, lease in got] == want
        for (_x, i), (_i, lease) in zip(want, got, strict=True):
            assert same(lease, self.live.pop(i))
        self.taken.extend(got)

    @precondition(lambda self: self.taken)
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        """A write that ended a lease was refused: the same delivery goes on."""
        item_id, lease = self.taken.pop(data.draw(st.integers(0, len(self.taken) - 1)))
        if item_id in self.live:
            with pytest.raises(ValueError):
                self.leases.restore(item_id, lease)
            return
        self.leases.restore(item_id, lease)
        self.live[item_id] = Model(
            lease.key,
            (lease.enqueue_time, lease.requeue_time, lease.dequeue_count),
            lease.expires,
            lease.delivery,
            lease.since,
            lease.source,
            lease.group,
        )

    # ---------------------------------------------------------------- what it says

    @invariant()
    def agrees(self) -> None:
        ls, live = self.leases, self.live
        assert len(ls) == len(live)
        assert ls.oldest_since() == min((m.since for m in live.values()), default=None)
        assert ls.next_expiry() == min((m.expires for m in live.values()), default=None)
        values = ls.values()
        assert sorted(i for i, _ in values) == sorted(live)
        for i, lease in values:
            assert same(lease, live[i]) and i in ls
            got = ls.get(i)
            assert got is not None and same(got, live[i])
        assert ls.get(self.next_id + 7) is None and self.next_id + 7 not in ls


LeasesMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestLeasesMachine = LeasesMachine.TestCase


# ------------------------------------------------------------------ hostile calls


def test_hostile_calls_are_refused_and_change_nothing() -> None:
    ls = Leases()
    key = encode_key(T0, 5)
    receipt = ls.add(5, key, 1, 2, 3, T0 + 100, None, T0, "g")
    before = [(i, repr(lease)) for i, lease in ls.values()]
    refused: list[tuple[type[BaseException], object]] = [
        (TypeError, lambda: ls.add(6, key[:15], 0, 0, 1, T0, None, T0, None)),
        (TypeError, lambda: ls.add(6, key + b"x", 0, 0, 1, T0, None, T0, None)),
        (TypeError, lambda: ls.add(6, bytearray(key), 0, 0, 1, T0, None, T0, None)),
        (TypeError, lambda: ls.add(6, key, 0, 0, 1, T0, None, T0, b"g")),
        (TypeError, lambda: ls.add(6, key, 0, 0, 1, T0, None, T0, 7)),
        (TypeError, lambda: ls.add("6", key, 0, 0, 1, T0, None, T0, None)),
        (OverflowError, lambda: ls.add(-6, key, 0, 0, 1, T0, None, T0, None)),
        (OverflowError, lambda: ls.add(2**64, key, 0, 0, 1, T0, None, T0, None)),
        (OverflowError, lambda: ls.add(6, key, 0, 0, 2**32, T0, None, T0, None)),
        (OverflowError, lambda: ls.add(6, key, 0, 0, -1, T0, None, T0, None)),
        (OverflowError, lambda: ls.add(6, key, 0, 0, 1, 2**63, None, T0, None)),
        (TypeError, lambda: ls.add(6, key, 0, 0, 1, T0, None, T0)),
        (ValueError, lambda: ls.add(5, key, 0, 0, 1, T0, None, T0, None)),
        (TypeError, lambda: ls.restore(6, (6, key))),
        (ValueError, lambda: ls.restore(5, ls.get(5))),
        (TypeError, lambda: ls.check(5, receipt, 10)),
        (TypeError, lambda: ls.check(5, receipt, 10, "now")),
        (TypeError, lambda: ls.extend(5, receipt, 10, T0, None)),
        (TypeError, lambda: ls.pop("5")),
        (KeyError, lambda: ls.pop(6)),
        (TypeError, lambda: ls.pop_expired(None)),
        (TypeError, lambda: Lease(key[:3], 0, 0, 1, T0, 1, None)),
        (TypeError, lambda: Lease(key, 0, 0, 1, T0, 1, None, 0, 3)),
        (TypeError, lambda: Leases(1)),  # type: ignore[call-arg]
    ]
    for exc, call in refused:
        with pytest.raises(exc):
            call()  # type: ignore[operator]
    # receipts that are not strings, and ids that are not ints, name no delivery
    for bad in (None, b"x.5.1", 5, ["a", "5", "1"]):
        with pytest.raises(InvalidReceipt, match="malformed"):
            ls.check(5, bad, 10, T0)  # type: ignore[arg-type]
    with pytest.raises(InvalidReceipt, match="another item"):
        ls.check("5", receipt, 10, T0)  # type: ignore[arg-type]
    assert [(i, repr(lease)) for i, lease in ls.values()] == before
    assert "5" not in ls and None not in ls and -1 not in ls and 2**70 not in ls
    assert ls.get("5") is None and ls.get(2**70) is None  # type: ignore[arg-type]
    assert ls.check(5, receipt, 10, T0).delivery == 1


def test_a_receipt_is_the_epoch_the_id_and_the_delivery_in_hex() -> None:
    """``docs/http.md``: ``<epoch>.<id hex>.<delivery hex>``, the epoch new for each set
    (each opening of a queue), so a receipt from before a restart is stale."""
    a, b = Leases(), Leases()
    assert len(a.epoch) == 8 and int(a.epoch, 16) >= 0 and a.epoch != b.epoch
    key = encode_key(T0, 0xABC)
    r = a.add(0xABC, key, 0, 0, 1, T0 + 10, None, T0, None)
    assert r == f"{a.epoch}.abc.1"
    b.add(0xABC, key, 0, 0, 1, T0 + 10, None, T0, None)
    with pytest.raises(StaleReceipt):
        b.check(0xABC, r, 0xABD, T0)  # the other set's epoch
    with pytest.raises(StaleReceipt):
        a.check(0xABC, r, 0xABD, T0 + 10)  # at its expiry exactly: over
    assert a.take(0xABC, r, 0xABD, T0 + 9).delivery == 1
    again = a.add(0xABC, key, 0, 0, 2, T0 + 10, None, T0, None)
    assert again == f"{a.epoch}.abc.2"  # a new delivery, a new receipt
    with pytest.raises(StaleReceipt):
        a.check(0xABC, r, 0xABD, T0)
    big = 2**64 - 1
    assert a.add(big, encode_key(T0, big), 0, 0, 1, T0 + 1, None, T0, None).endswith(f".{big:x}.3")


def test_expiry_order_is_expires_then_id_and_extends_move_a_lease_either_way() -> None:
    ls = Leases()
    receipts = {}
    for i, x in [(9, 500), (3, 500), (7, 100), (1, 900), (4, 300)]:
        receipts[i] = ls.add(i, encode_key(T0, i), 0, 0, 1, T0 + x, None, T0 + i, None)
    ls.extend(1, receipts[1], 10, T0, T0 + 50)  # shorter: first now
    ls.extend(7, receipts[7], 10, T0, T0 + 500)  # longer: among the 500s, by id
    assert ls.next_expiry() == T0 + 50 and ls.oldest_since() == T0 + 1  # since kept
    assert [i for i, _ in ls.pop_expired(T0 + 499)] == [1, 4]
    assert [i for i, _ in ls.pop_expired(T0 + 500)] == [3, 7, 9]
    assert ls.next_expiry() is None and ls.oldest_since() is None and len(ls) == 0


# ------------------------------------------------------------------ references and memory


def test_sources_and_group_names_are_held_once_and_let_go() -> None:
    class Source:
        pass

    src, group = Source(), "".join(["grp", "-x"])  # a str of its own
    counts = (sys.getrefcount(src), sys.getrefcount(group))
    ls = Leases()
    for i in range(1, 101):
        ls.add(i, encode_key(T0, i), 0, 0, 1, T0 + i, src, T0, group)
    assert (sys.getrefcount(src), sys.getrefcount(group)) == (counts[0] + 100, counts[1] + 100)
    snap = ls.get(1)
    assert snap is not None and snap.source is src and snap.group is group
    del snap
    ls.pop(1)
    ls.take(2, f"{ls.epoch}.2.2", 200, T0)
    assert len(ls.pop_expired(T0 + 50)) == 48
    assert len(ls.values()) == 50
    assert (sys.getrefcount(src), sys.getrefcount(group)) == (counts[0] + 50, counts[1] + 50)
    del ls
    assert (sys.getrefcount(src), sys.getrefcount(group)) == counts


def test_a_cycle_through_a_lease_source_is_collected() -> None:
    """A source that refers back to the set (a segment kept by the queue that owns the
    leases) is found by the cycle collector through the set's records."""

    class Holder:
        leases: Leases | None = None

    gc.collect()
    holder = Holder()
    holder.leases = Leases()
    holder.leases.add(1, encode_key(T0, 1), 0, 0, 1, T0 + 1, holder, T0, None)
    gone = weakref.ref(holder)
    lease = holder.leases.get(1)
    del holder
    assert gone() is not None  # held by the snapshot too
    del lease
    gc.collect()
    assert gone() is None


def test_a_lease_costs_its_record_and_its_places_and_ended_ones_give_their_room_back() -> None:
    """tracemalloc sees every byte (``allocated``), a lease costs its 96-byte record, a
    4-byte slot of the id table and two 4-byte heap places (with their arrays' room to
    grow), and a set whose leases ended holds a constant."""
    n = 100_000
    keys = [encode_key(T0, i) for i in range(1, n + 1)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    ls = Leases()
    for i, key in enumerate(keys, 1):
        ls.add(i, key, T0, 0, 1, T0 + 600_000, None, T0, None)
    traced = tracemalloc.get_traced_memory()[0] - before
    assert RECORD == 96 and KEY == 16
    assert abs(traced - ls.allocated) < 4096  # the set and its epoch beside the blocks
    per = ls.allocated / n
    assert RECORD + 12 <= per < 1.6 * (RECORD + 8) + 16, per
    for i in range(1, n + 1):
        ls.pop(i)
    assert ls.allocated < 64 * (RECORD + 16)
    tracemalloc.stop()
