"""The compiled log framing and system calls (``storage/_wal.c``): framing equal to the
format's (CRC-32 as zlib's), hostile calls refused, failures of the write and of the
sync told apart, and the fault seam kept: no module but ``storage/fileio.py`` calls the
compiled system calls, the C sources make no file system call outside them, and every
byte of a log reaches the file through the seam's calls, announced to its hooks."""

from __future__ import annotations

import errno
import os
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dq.storage import Engine, EngineConfig, NewItem, _wal, fileio
from dq.storage.errors import StorageFull
from dq.storage.wal import HEADER, RECORD_ENTRIES, RECORD_HEADER, WalWriter, read_wal

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "storage", "shm", "client", "cli", "pipeline")


# ------------------------------------------------------------------ framing


@given(st.binary(max_size=3000), st.integers(0, (1 << 32) - 1))
def test_crc32_is_zlibs(data: bytes, start: int) -> None:
    assert _wal.crc32(data) == zlib.crc32(data)
    assert _wal.crc32(data, start) == zlib.crc32(data, start)
    assert _wal.crc32(memoryview(data)[1:]) == zlib.crc32(data[1:])


def test_crc32_of_a_large_buffer_is_zlibs() -> None:
    data = os.urandom(3 << 20)  # computed with the GIL released
    assert _wal.crc32(data) == zlib.crc32(data)


@given(st.binary(max_size=600), st.integers(0, 255), st.binary(max_size=20))
def test_a_framed_record_is_the_formats(body: bytes, kind: int, before: bytes) -> None:
    """length u32 | crc32 over the type byte then the payload | type u8 | payload."""
    buf = bytearray(before)
    n = _wal.frame_into(buf, body, kind)
    want = RECORD_HEADER.pack(len(body), zlib.crc32(bytes((kind,)) + body), kind) + body
    assert n == len(want) and bytes(buf) == before + want
    assert _wal.header(body, kind) == want[: RECORD_HEADER.size]


def test_hostile_framing_is_refused_and_appends_nothing() -> None:
    buf = bytearray(b"kept")
    for kind in (-1, 256, 1 << 40):
        with pytest.raises((ValueError, OverflowError)):
            _wal.frame_into(buf, b"x", kind)
    with pytest.raises(TypeError):
        _wal.frame_into(b"immutable", b"x", 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _wal.frame_into(buf, "text", 1)  # type: ignore[arg-type]
    with memoryview(buf), pytest.raises(BufferError):  # exported: it cannot grow
        _wal.frame_into(buf, b"x", 1)
    with pytest.raises(BufferError):
        _wal.frame_into(buf, buf, 1)  # framing a buffer into itself
    assert buf == b"kept"
    with pytest.raises(TypeError):
        _wal.crc32("text")  # type: ignore[arg-type]


# ------------------------------------------------------------------ system calls


@pytest.fixture
def devnull() -> Iterator[int]:
    """A descriptor that takes writes and refuses fdatasync (EINVAL)."""
    fd = os.open(os.devnull, os.O_WRONLY)
    yield fd
    os.close(fd)


def test_the_system_calls_write_at_offsets_and_sync(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"0123456789")
    fd = os.open(path, os.O_WRONLY)
    try:
        _wal.pwrite_all(fd, b"ab", 2)
        _wal.fdatasync(fd)
        assert _wal.pwrite_fdatasync(fd, memoryview(b"xyz-long-tail"), 8) == 0
        _wal.pwrite_all(fd, b"", 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"01ab4567xyz-long-tail"


def test_a_failed_write_raises_and_a_failed_sync_is_returned(devnull: int) -> None:
    closed = os.open(os.devnull, os.O_WRONLY)
    os.close(closed)
    for call in (
        lambda: _wal.pwrite_all(closed, b"x", 0),
        lambda: _wal.pwrite_fdatasync(closed, b"x", 0),
        lambda: _wal.fdatasync(closed),
    ):
        with pytest.raises(OSError) as err:
            call()
        assert err.value.errno == errno.EBADF
    assert _wal.pwrite_fdatasync(devnull, b"x", 0) == errno.EINVAL  # written, not synced
    for bad in ((-1, b"x", 0), (devnull, b"x", -1), (devnull, b"x", 1 << 64)):
        with pytest.raises((ValueError, OverflowError)):
            _wal.pwrite_all(*bad)


def test_a_log_whose_sync_fails_has_written_but_not_synced(devnull: int) -> None:
    """As with a write then a sync: the offset moves past the data, the synced one not."""
    wal = WalWriter("/dev/null", 1, 1, devnull, HEADER.size)
    wal.append(b"entries")
    data, _seq = wal.take_buffer()
    with pytest.raises(OSError) as err:
        wal.write_and_sync(data)
    assert err.value.errno == errno.EINVAL
    assert wal.offset == HEADER.size + len(data) and wal.synced_offset == HEADER.size
    assert fileio.pwrite_and_sync(devnull, b"x", 0, "/dev/null") is not None


def test_a_full_disk_on_the_compiled_write_is_storage_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio, "_wal", SimpleNamespace(pwrite_fdatasync=full))
    with pytest.raises(StorageFull):
        fileio.pwrite_and_sync(0, b"x", 0, "q/0000000001.log")


# ------------------------------------------------------------------ the seam


_IO = ("pwrite_all", "fdatasync", "pwrite_fdatasync")
_CALLS = re.compile(r"_wal\.(" + "|".join(_IO) + r")\b")


def test_only_the_seam_calls_the_compiled_system_calls() -> None:
    callers = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            text = path.read_text()
            if _CALLS.search(text) or "from dq.storage._wal import" in text:
                callers.append(str(path.relative_to(ROOT)))
    assert callers == ["storage/fileio.py"]


#: (C file, function, system call): the only file system calls compiled code makes
ALLOWED = {
    ("storage/_wal.c", "do_pwrite_all", "pwrite"),
    ("storage/_wal.c", "do_fdatasync", "fdatasync"),
}
_SYSCALL = re.compile(
    r"\b(pwrite|pwritev|write|writev|fsync|fdatasync|sync_file_range|ftruncate|truncate|"
    r"open|openat|creat|rename|renameat|unlink|unlinkat|fallocate|posix_fallocate|close|"
    r"mmap|msync|fopen|fwrite)\s*\("
)


def test_compiled_code_makes_no_file_step_outside_the_seams_wrappers() -> None:
    found = set()
    for path in sorted([*ROOT.glob("storage/*.c"), *ROOT.glob("shm/*.c")]):
        function = None
        for line in path.read_text().splitlines():
            head = re.match(r"^([A-Za-z_]\w*)\(", line)
            if head:
                function = head.group(1)
            code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', line.split("//")[0])  # not in strings
            if code.lstrip().startswith(("*", "/*")):
                continue  # comments
            for m in _SYSCALL.finditer(code):
                found.add((str(path.relative_to(ROOT)), function, m.group(1)))
    assert found == ALLOWED


class _Recording:
    """The compiled module as fileio sees it, each system call recorded in ``events``."""

    def __init__(self, events: list[tuple[Any, ...]]) -> None:
        self.events = events

    def __getattr__(self, name: str) -> Any:
        real = getattr(_wal, name)
        if name not in _IO:
            return real

        def call(*args: Any) -> Any:
            if name == "fdatasync":
                self.events.append((name, args[0]))
            else:
                self.events.append((name, args[0], bytes(args[1]), args[2]))
            return real(*args)

        return call


def _log_path(root: Path) -> Path:
    (log,) = root.glob("queues/q/*.log")
    return log


def _log_bytes_through(events: list[tuple[Any, ...]], size: int) -> bytes:
    """The file as the recorded writes made it (zeros where nothing was written)."""
    out = bytearray(size)
    for e in events:
        if e[0] != "fdatasync":
            _name, _fd, data, offset = e
            out[offset : offset + len(data)] = data
    return bytes(out)


@pytest.mark.parametrize("watched", [False, True], ids=["one compiled call", "steps watched"])
def test_every_byte_of_the_log_goes_through_the_seam(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, watched: bool
) -> None:
    """The log's records reach the file only through fileio's compiled calls (so a fault
    injected there is one the engine meets), each write announced to the hooks before it
    and each sync after its write."""
    events: list[tuple[Any, ...]] = []
    monkeypatch.setattr(fileio, "_wal", _Recording(events))
    if watched:
        monkeypatch.setattr(fileio, "FAULTS", [lambda step, path: events.append(("step", step))])
    e = Engine.open(str(tmp_path), EngineConfig(fsync="always", compaction="inline"))
    try:
        for i in range(20):
            e.enqueue("q", [NewItem(b"item %d" % i)])
        log = _log_path(tmp_path)
        contents = read_wal(str(log))
        assert len(contents.records) == 20
        compiled = [x for x in events if x[0] != "step"]
        assert compiled, "the log was written without the compiled calls"
        written = _log_bytes_through(compiled, contents.valid_end)
        # after the header (written whole at creation), every byte came through the seam
        assert written[HEADER.size :] == log.read_bytes()[HEADER.size : contents.valid_end]
        rounds = [x for x in compiled if x[0] == "pwrite_fdatasync"]
        if watched:
            assert rounds == []  # each step on its own, announced first
            for n, x in enumerate(events):
                if x[0] == "pwrite_all":
                    assert events[n - 1] == ("step", "write"), events[n - 1 : n + 1]
                if x[0] == "fdatasync":
                    assert events[n - 1] == ("step", "fsync")
                    assert any(y[0] == "pwrite_all" for y in events[:n])
        else:
            assert len(rounds) >= 20  # a round's write and sync in one call
    finally:
        e.close()


def test_a_record_framed_by_the_writer_reads_back(tmp_path: Path) -> None:
    wal = WalWriter.create(str(tmp_path), 7, 100)
    try:
        wal.append(b"payload one")
        wal.append(b"two", meta=b"meta")
        data, seq = wal.take_buffer()
        with wal.io_lock:
            wal.write_and_sync(data)
        assert seq == 2 and wal.synced_offset == wal.offset == wal.size
    finally:
        wal.close(sync=True)
    got = read_wal(wal.path)
    assert [p for _o, p in got.records] == [b"payload one", b"two"]
    assert [m for _o, m in got.meta] == [b"meta"] and got.segment_no == 7
    assert RECORD_ENTRIES == 1
