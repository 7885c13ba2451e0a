"""The C extension dq.shm._atomics: checked, ordered, atomic accesses and shared futexes."""

from __future__ import annotations

import mmap
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dq.shm import _atomics as at

CHILD_TIMEOUT_S = 60


def test_load_store_round_trip_on_every_buffer_kind() -> None:
    mm = mmap.mmap(-1, 64)
    for buf in (bytearray(64), mm, memoryview(bytearray(64))):
        at.store_u8(buf, 3, 0xAB)
        at.store_u32(buf, 8, 0xDEADBEEF)
        at.store_u64(buf, 16, 0x0123456789ABCDEF)
        assert at.load_u8(buf, 3) == 0xAB
        assert at.load_u32(buf, 8) == 0xDEADBEEF
        assert at.load_u64(buf, 16) == 0x0123456789ABCDEF
        # little-endian, as every ring layout requires
        assert bytes(buf[16:24]) == (0x0123456789ABCDEF).to_bytes(8, "little")
    mm.close()


def test_loads_work_on_read_only_buffers() -> None:
    data = (7).to_bytes(8, "little") + bytes(8)
    assert at.load_u64(data, 0) == 7
    with pytest.raises(BufferError):
        at.store_u64(data, 0, 1)


@pytest.mark.parametrize(
    ("fn", "args"),
    [
        (at.load_u64, (-8,)),
        (at.load_u64, (64,)),
        (at.load_u64, (60,)),
        (at.load_u64, (4,)),
        (at.load_u32, (2,)),
        (at.store_u32, (62, 1)),
        (at.cas_u64, (12, 0, 1)),
        (at.fetch_add_u32, (1, 1)),
        (at.futex_wait, (2, 0, 0.0)),
        (at.futex_wake, (66,)),
        (at.store_u8, (0, 256)),
        (at.store_u8, (0, -1)),
        (at.store_u32, (0, 1 << 32)),
        (at.store_u64, (0, 1 << 64)),
        (at.cas_u32, (0, 1 << 32, 0)),
    ],
)
def test_out_of_bounds_misaligned_or_out_of_range_raise_value_error(
    fn: object, args: tuple[object, ...]
) -> None:
    buf = bytearray(64)
    with pytest.raises(ValueError):
        fn(buf, *args)  # type: ignore[operator]
    assert buf == bytearray(64)


def test_memoryview_offset_alignment_is_checked_on_the_real_address() -> None:
    base = bytearray(64)
    view = memoryview(base)[4:]
    at.store_u32(view, 0, 5)  # address base+4: 4-aligned
    assert at.load_u32(base, 4) == 5
    with pytest.raises(ValueError):  # base+4 is not 8-aligned
        at.load_u64(view, 0)


def test_cas_succeeds_only_on_the_expected_value() -> None:
    buf = bytearray(16)
    at.store_u64(buf, 8, 10)
    assert at.cas_u64(buf, 8, 10, 11) is True
    assert at.cas_u64(buf, 8, 10, 12) is False
    assert at.load_u64(buf, 8) == 11
    assert at.cas_u32(buf, 0, 0, 0xFFFFFFFF) is True
    assert at.load_u32(buf, 0) == 0xFFFFFFFF


def test_fetch_add_and_sub_return_the_old_value_and_wrap() -> None:
    buf = bytearray(16)
    at.store_u32(buf, 0, 0xFFFFFFFF)
    assert at.fetch_add_u32(buf, 0, 2) == 0xFFFFFFFF
    assert at.load_u32(buf, 0) == 1
    assert at.fetch_sub_u32(buf, 0, 2) == 1
    assert at.load_u32(buf, 0) == 0xFFFFFFFF
    at.store_u64(buf, 8, (1 << 64) - 1)
    assert at.fetch_add_u64(buf, 8, 1) == (1 << 64) - 1
    assert at.load_u64(buf, 8) == 0
    assert at.fetch_add_u64(buf, 8, -1) == 0  # a negative delta is taken modulo 2**64
    assert at.load_u64(buf, 8) == (1 << 64) - 1
    at.fence()


def test_futex_wait_returns_at_once_when_the_value_differs_and_times_out_otherwise() -> None:
    buf = bytearray(8)
    at.store_u32(buf, 4, 3)
    assert at.futex_wait(buf, 4, 2, None) is True
    started = time.monotonic()
    assert at.futex_wait(buf, 4, 3, 0.02) is False
    assert time.monotonic() - started >= 0.015
    assert at.futex_wake(buf, 4) == 0


def test_futex_wake_wakes_a_thread_and_releases_the_gil_while_waiting() -> None:
    mm = mmap.mmap(-1, 64)
    woke: list[bool] = []

    def waiter() -> None:
        woke.append(at.futex_wait(mm, 0, 0, 10.0))

    t = threading.Thread(target=waiter)
    t.start()
    # this loop only makes progress if the waiter released the GIL
    deadline = time.monotonic() + 5
    while at.futex_wake(mm, 0, 1) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    t.join(timeout=10)
    assert woke == [True]
    mm.close()


def test_spin_wait_returns_the_new_value_or_none_on_timeout() -> None:
    buf = bytearray(16)
    assert at.spin_wait_u32(buf, 4, 0, timeout_s=0.01, spin_us=100) is None
    assert at.spin_wait_u8(buf, 6, 0, timeout_s=0.01) is None
    assert at.spin_wait_u64(buf, 8, 0, timeout_s=0.0) is None
    at.store_u8(buf, 6, 9)
    assert at.spin_wait_u8(buf, 6, 0, timeout_s=1.0) == 9
    at.store_u64(buf, 8, 1 << 40)
    assert at.spin_wait_u64(buf, 8, 0, timeout_s=1.0) == 1 << 40


def test_spin_wait_parks_then_wakes_on_a_store_and_wake_from_another_thread() -> None:
    mm = mmap.mmap(-1, 4096)
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(at.spin_wait_u8(mm, 2074, 0, 10.0, 0.0)))
    t.start()
    time.sleep(0.05)  # the waiter is parked on the word at 2072 by now
    at.store_u8(mm, 2074, 1)
    at.futex_wake(mm, 2072)
    t.join(timeout=10)
    assert got == [1]
    mm.close()


def test_a_wake_without_a_change_interrupts_spin_wait() -> None:
    mm = mmap.mmap(-1, 64)
    got: list[int | None] = []
    t = threading.Thread(target=lambda: got.append(at.spin_wait_u64(mm, 8, 0, 10.0, 0.0)))
    t.start()
    deadline = time.monotonic() + 5
    while at.futex_wake(mm, 8) == 0 and time.monotonic() < deadline:
        time.sleep(0.001)
    t.join(timeout=10)
    assert got == [0]  # returned the unchanged value: the caller re-checks why it woke
    mm.close()


CHILD = """
import mmap, sys
from dq.shm import _atomics as at
path, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "r+b") as f:
    mm = mmap.mmap(f.fileno(), 4096)
if mode == "add":
    at.store_u32(mm, 8, 1)  # ready flag for the parent
    at.futex_wake(mm, 8)
    for _ in range(n):
        at.fetch_add_u64(mm, 0, 1)
    for _ in range(n):
        while True:
            old = at.load_u32(mm, 16)
            if at.cas_u32(mm, 16, old, old + 1):
                break
else:
    at.store_u32(mm, 8, 1)
    at.futex_wake(mm, 8)
    # wait for the parent to flip the word at 12, parked on a shared futex
    sys.exit(0 if at.spin_wait_u32(mm, 12, 0, timeout_s=20.0, spin_us=0.0) == 7 else 3)
"""


def _map_file(tmp_path: Path) -> tuple[Path, mmap.mmap]:
    path = tmp_path / "shared"
    path.write_bytes(bytes(4096))
    with path.open("r+b") as f:
        return path, mmap.mmap(f.fileno(), 4096)


@pytest.mark.integration
def test_fetch_add_and_cas_are_atomic_across_processes(tmp_path: Path) -> None:
    path, mm = _map_file(tmp_path)
    n = 20_000
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), "add", str(n)])
    try:
        assert at.spin_wait_u32(mm, 8, 0, timeout_s=CHILD_TIMEOUT_S) == 1
        for _ in range(n):
            at.fetch_add_u64(mm, 0, 1)
        for _ in range(n):
            while True:
                old = at.load_u32(mm, 16)
                if at.cas_u32(mm, 16, old, old + 1):
                    break
        assert child.wait(timeout=CHILD_TIMEOUT_S) == 0
    finally:
        child.kill()
        child.wait(timeout=CHILD_TIMEOUT_S)
    assert at.load_u64(mm, 0) == 2 * n
    assert at.load_u32(mm, 16) == 2 * n
    mm.close()


@pytest.mark.integration
def test_futex_wakes_a_waiter_in_another_process(tmp_path: Path) -> None:
    path, mm = _map_file(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(path), "wait", "0"])
    try:
        assert at.spin_wait_u32(mm, 8, 0, timeout_s=CHILD_TIMEOUT_S) == 1
        time.sleep(0.1)  # let the child park
        at.store_u32(mm, 12, 7)
        at.futex_wake(mm, 12)
        assert child.wait(timeout=CHILD_TIMEOUT_S) == 0
    finally:
        child.kill()
        child.wait(timeout=CHILD_TIMEOUT_S)
    mm.close()
