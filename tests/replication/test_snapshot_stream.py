"""The snapshot's tar stream on its own: a whole stream is a valid tar with
snapshot.json first and removes its directory; a stream whose producer fails ends with
an error (no end-of-archive marker reaches the follower), runs its failure callback and
removes its directory too; a reader that stops early stops the producer; leftovers of
an earlier process are removed by the next snapshot."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dq.server.replication import snapshot_stream
from dq.server.replication.snapshot_stream import (
    SNAPSHOT_DIR,
    make_snapshot,
    snapshot_dirs,
    tar_chunks,
)


class CopyEngine:
    """``snapshot`` writes a few files as the engine's copy would."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes

    def snapshot(self, dest: str) -> dict[str, int]:
        for name, size in self.sizes.items():
            qdir = Path(dest) / "queues" / name
            qdir.mkdir(parents=True)
            (qdir / "queue.json").write_text("{}")
            (qdir / "00000001.log").write_bytes(b"x" * size)
        return {name: 7 for name in self.sizes}


def wait_until(check: Callable[[], bool], timeout: float = 10.0) -> None:
    give_up = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.01)


async def collect(root: Path, failed: threading.Event, limit: int | None = None) -> bytes:
    out = bytearray()
    stream = tar_chunks(root, failed.set)
    try:
        async for chunk in stream:
            out += chunk
            if limit is not None and len(out) >= limit:
                break
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return bytes(out)


def test_a_whole_stream_is_a_tar_with_snapshot_json_first(tmp_path: Path) -> None:
    root = make_snapshot(CopyEngine({"a": 10, "b": 3 << 20}), str(tmp_path), 4, 99)  # type: ignore[arg-type]
    failed = threading.Event()
    data = asyncio.run(collect(root, failed))
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        names = tar.getnames()
        snap = tar.extractfile("snapshot.json")
        assert snap is not None
        assert json.loads(snap.read()) == {"epoch": 4, "lsn": 99, "queues": {"a": 7, "b": 7}}
        log = tar.extractfile("queues/b/00000001.log")
        assert log is not None and len(log.read()) == 3 << 20
    assert names[0] == "snapshot.json"
    assert "queues/a/queue.json" in names
    wait_until(lambda: snapshot_dirs(str(tmp_path)) == [])
    assert not failed.is_set()


def test_a_failing_producer_cuts_the_stream_and_cleans_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = make_snapshot(CopyEngine({"a": 10, "b": 10}), str(tmp_path), 4, 99)  # type: ignore[arg-type]
    real = tarfile.TarFile.addfile
    calls = 0

    def flaky(self: tarfile.TarFile, *args: Any, **kwargs: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 4:
            raise OSError(5, "Input/output error")
        real(self, *args, **kwargs)

    monkeypatch.setattr(tarfile.TarFile, "addfile", flaky)
    failed = threading.Event()
    with pytest.raises(RuntimeError, match="snapshot stream failed"):
        asyncio.run(collect(root, failed))
    wait_until(failed.is_set)
    wait_until(lambda: snapshot_dirs(str(tmp_path)) == [])


def test_a_reader_that_stops_early_stops_the_producer(tmp_path: Path) -> None:
    root = make_snapshot(CopyEngine({"big": 40 << 20}), str(tmp_path), 4, 99)  # type: ignore[arg-type]
    failed = threading.Event()
    data = asyncio.run(collect(root, failed, limit=1))
    assert 0 < len(data) < 40 << 20
    wait_until(failed.is_set)  # not complete: the follower is released
    wait_until(lambda: snapshot_dirs(str(tmp_path)) == [])
    wait_until(lambda: not any(t.name == "dq-snapshot-tar" for t in threading.enumerate()))


def test_leftovers_of_an_earlier_process_go_with_the_next_snapshot(tmp_path: Path) -> None:
    stale = tmp_path / SNAPSHOT_DIR / "snap-old"
    (stale / "queues").mkdir(parents=True)
    root = make_snapshot(CopyEngine({"a": 1}), str(tmp_path), 1, 0)  # type: ignore[arg-type]
    assert not stale.exists()
    assert snapshot_dirs(str(tmp_path)) == [root.name]
    snapshot_stream.remove_snapshot(root)
    assert snapshot_dirs(str(tmp_path)) == []
