"""A log's allocation step (``storage/prealloc.py``): the rule on a clock the test moves,
then through an engine's real writes, ``posix_fallocate`` and the file sizes a user
sees: a hot log's step doubles up to 1 MiB, a cold log's stays at 64 KiB, closing gives
the tail back, and a fault or a power loss at a grown allocation loses nothing that was
acknowledged."""

from __future__ import annotations

import errno
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, fileio, prealloc
from dq.storage.errors import EngineUnavailable, StorageError, StorageFull
from dq.storage.prealloc import COLD_SECONDS, HOT_SECONDS, AllocationStep, allocation_step
from tests.storage.faults import AckCheck, OneShot, crash_engine

KIB = 1024
MIB = 1024 * KIB
BASE = 64 * KIB


class Clock:
    """Seconds for ``prealloc.monotonic``, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def step_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    c = Clock()
    monkeypatch.setattr(prealloc, "monotonic", c)
    yield c


def _steps(rule: AllocationStep, clock: Clock, gaps: list[float]) -> list[int]:
    """The step of each allocation, each ``gap`` seconds after the one before."""
    out = []
    end = 0
    for gap in gaps:
        clock.now += gap
        grown = rule.end_for(end + 1)
        assert grown % rule.step == 0 and end < grown <= end + 1 + rule.step
        out.append(rule.step)
        end = grown
    return out


def test_a_log_used_up_soon_doubles_its_step_up_to_the_cap(step_clock: Clock) -> None:
    rule = AllocationStep(BASE, MIB)
    steps = _steps(rule, step_clock, [0.0] + [0.5] * 7)
    assert steps == [BASE, 2 * BASE, 4 * BASE, 8 * BASE, MIB, MIB, MIB, MIB]


def test_a_cold_log_keeps_the_base_step(step_clock: Clock) -> None:
    rule = AllocationStep(BASE, MIB)
    assert _steps(rule, step_clock, [0.0] + [HOT_SECONDS + 1] * 5) == [BASE] * 6
    assert _steps(rule, step_clock, [COLD_SECONDS + 1] * 3) == [BASE] * 3


def test_a_hot_log_gone_cold_goes_back_to_the_base_and_a_steady_one_keeps_its_step(
    step_clock: Clock,
) -> None:
    rule = AllocationStep(BASE, MIB)
    assert _steps(rule, step_clock, [0.0] + [0.1] * 4)[-1] == MIB
    # used up in between "soon" and "cold": the step stays, no saw between two sizes
    assert _steps(rule, step_clock, [HOT_SECONDS + 1, COLD_SECONDS - 1]) == [MIB] * 2
    assert _steps(rule, step_clock, [COLD_SECONDS + 1])[-1] == BASE


def test_a_cap_at_the_base_is_a_fixed_step(step_clock: Clock) -> None:
    rule = AllocationStep(BASE, BASE)
    assert _steps(rule, step_clock, [0.0] * 6) == [BASE] * 6
    assert allocation_step(EngineConfig(wal_prealloc_bytes=0)) is None
    made = allocation_step(EngineConfig())
    assert made is not None and (made.base, made.cap) == (BASE, MIB)


def _config(**kw: object) -> EngineConfig:
    return EngineConfig(
        **{"fsync": "always", "compaction": "inline", "auto_merge": False, **kw}  # type: ignore[arg-type]
    )


def _tails(
    e: Engine, writes: int, size: int, tick: Clock | None = None, gap: float = 0
) -> list[int]:
    """Enqueue ``writes`` values of ``size`` bytes, one a call; the zeros the log holds
    beyond its records after each (its size on disk less its written bytes)."""
    out = []
    for i in range(writes):
        if tick is not None:
            tick.now += gap
        e.enqueue("q", [NewItem(b"%06d" % i + b"v" * (size - 6))])
        wal = e.queue("q").commit.wal
        out.append(os.path.getsize(wal.path) - wal.offset)
    return out


def _allocations(path_end: str) -> tuple[list[str], fileio.FaultHook]:
    seen: list[str] = []

    def hook(step: str, path: str) -> None:
        if step == "allocate" and path.endswith(path_end):
            seen.append(path)

    return seen, hook


def test_a_hot_log_grows_its_step_to_1_mib_and_closing_gives_the_tail_back(
    tmp_path: Path,
) -> None:
    """Written as fast as the disk takes it (well within ``HOT_SECONDS`` a step), a log's
    zeros ahead grow past 64 KiB to at most 1 MiB, so 4 MB take a handful of
    allocations instead of 64; closing leaves the file exactly its records, and
    reopening finds every item."""
    seen, hook = _allocations(".log")
    with Engine.open(tmp_path / "d", _config()) as e:
        e.ensure_queue("q")
        fileio.FAULTS.append(hook)
        try:
            tails = _tails(e, 40, 100 * KIB)
        finally:
            fileio.FAULTS.remove(hook)
        wal = e.queue("q").commit.wal
        assert max(tails) <= MIB
        assert max(tails) > 512 * KIB  # grew past the 64 KiB a fixed step holds
        assert os.path.getsize(wal.path) % MIB == 0  # the last steps are 1 MiB each
        assert len(seen) <= 10  # 64 KiB steps would take 64 allocations
        assert os.stat(wal.path).st_blocks * 512 >= os.path.getsize(wal.path)  # allocated
    assert os.path.getsize(wal.path) == wal.offset  # closing gave the tail back
    with Engine.open(tmp_path / "d", _config()) as e:
        assert e.stats("q").pending == 40


def test_a_cold_log_keeps_64_kib_steps(tmp_path: Path, step_clock: Clock) -> None:
    """A log written seldom (here a write every 30 s of the rule's clock) holds less than
    64 KiB of zeros ahead however much it has written; one that was hot and went cold
    for over a minute gets a 64 KiB step again at its next allocation."""
    with Engine.open(tmp_path / "d", _config()) as e:
        e.ensure_queue("q")
        cold = _tails(e, 30, 10 * KIB, step_clock, 30.0)
        assert max(cold) < BASE
        hot = _tails(e, 20, 100 * KIB, step_clock, 0.01)
        assert max(hot) > 512 * KIB
        wal = e.queue("q").commit.wal
        allocated = os.path.getsize(wal.path)
        written = []
        while os.path.getsize(wal.path) == allocated:  # the 1 MiB step used up slowly
            written += _tails(e, 1, 10 * KIB, step_clock, COLD_SECONDS + 1)
            assert len(written) < 200
        assert written[-1] < BASE  # the step after it is the base again


@pytest.mark.parametrize("err", ["ENOSPC", "EIO"])
def test_a_fault_at_a_grown_allocation_refuses_loudly_and_loses_nothing(
    tmp_path: Path, err: str
) -> None:
    """The fifth allocation of a hot log asks for a 1 MiB step; a full disk or EIO
    there refuses that write (507 / 503), keeps every acknowledged one, and the queue
    takes writes again once the fault clears."""
    shot = OneShot("append", "allocate", "log", getattr(errno, err), nth=5)
    acked: list[int] = []
    with Engine.open(tmp_path / "d", _config()) as e:
        e.ensure_queue("q")
        with shot.armed():
            refused = None
            for _ in range(40):
                try:
                    acked += [x.id for x in e.enqueue("q", [NewItem(b"v" * 100 * KIB)])]
                except StorageError as exc:
                    refused = exc
                    break
        assert shot.fired
        assert isinstance(refused, StorageFull if err == "ENOSPC" else EngineUnavailable)
        assert refused.http_status == (507 if err == "ENOSPC" else 503)
        assert len(acked) >= 10  # past the 512 KiB step: the one refused asked for 1 MiB
        give_up = time.monotonic() + 10
        while True:  # the fault cleared: the queue reopens from disk by itself
            try:
                after = e.enqueue("q", [NewItem(b"after")])
                break
            except EngineUnavailable:
                assert time.monotonic() < give_up, "the queue did not reopen"
                time.sleep(0.05)
        assert e.stats("q").pending == len(acked) + 1
    with Engine.open(tmp_path / "d", _config()) as e:
        got = e.dequeue("q", 100)
        assert sorted(d.id for d in got) == sorted([*acked, after[0].id])


def test_a_power_loss_with_a_grown_step_keeps_every_acknowledged_write(tmp_path: Path) -> None:
    """A crash that takes back whatever was not synced, in the middle of a hot log's
    1 MiB steps: every write acknowledged is recovered, each before its answer was
    durable (``AckCheck``), and the zeros ahead read as the end of the log."""
    data = tmp_path / "d"
    data.mkdir()
    with fileio.simulate_power_loss(str(data)) as power, AckCheck(power) as acks:
        e = Engine.open(data, _config())
        acked = [x.id for i in range(25) for x in e.enqueue("q", [NewItem(b"v" * 100 * KIB)])]
        wal = e.queue("q").commit.wal
        assert os.path.getsize(wal.path) - wal.offset > BASE  # a grown step is ahead
        crash_engine(e, power, power_loss=True, rng=random.Random(7))
        assert not acks.violations and acks.checked == 25
    with Engine.open(data, _config()) as e:
        assert sorted(d.id for d in e.dequeue("q", 100)) == sorted(acked)
