"""A leader's snapshot for a joining follower, made on disk and streamed as a tar.

``make_snapshot`` asks the engine for a consistent copy of every queue in a fresh
directory under ``DATA_DIR/.replica-snapshots/`` (the same file system as the queues, so
immutable files are hard links, not copies; the engine clears it when it opens) and writes ``snapshot.json`` beside it.
``tar_chunks`` streams the directory as an uncompressed tar (``snapshot.json`` first)
from a thread of its own through a small bounded queue, so the event loop never reads a
file and a slow follower holds at most a few chunks in memory. The directory is removed
once the stream ends, whichever way; directories left by a crash, or by a response that
never started, are removed by the next snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import shutil
import tarfile
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from dq.storage.replica_engine import SCRATCH_PREFIX

if TYPE_CHECKING:
    from dq.storage import Engine

__all__ = [
    "CHUNK_BYTES",
    "SNAPSHOT_DIR",
    "SNAPSHOT_JSON",
    "make_snapshot",
    "take_snapshot",
    "tar_chunks",
]

logger = logging.getLogger(__name__)

#: Under the data directory (a name the engine removes when it opens): one
#: sub-directory per snapshot being streamed.
SNAPSHOT_DIR = SCRATCH_PREFIX + "snapshots"
SNAPSHOT_JSON = "snapshot.json"
#: The stream's unit, and (times ``_QUEUED``) the most a slow follower makes us hold.
CHUNK_BYTES = 1 << 20
_QUEUED = 4
_POLL_S = 0.1

_active: set[str] = set()
_active_lock = threading.Lock()
#: the snapshots' blocking steps (the copy, each chunk's hand-over) run here, never on
#: the event loop's default executor: admin calls may all sit there waiting for a
#: commit that the follower taking this snapshot is needed for
_THREADS = ThreadPoolExecutor(4, thread_name_prefix="dq-snapshot")


class _Cancelled(Exception):
    """The reader went away: the producing thread stops."""


async def take_snapshot(engine: Engine, data_dir: str, epoch: int, lsn: int) -> Path:
    """``make_snapshot`` on the snapshots' own threads."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_THREADS, make_snapshot, engine, data_dir, epoch, lsn)


def make_snapshot(engine: Engine, data_dir: str, epoch: int, lsn: int) -> Path:
    """Blocking (run it in a thread): the snapshot directory, ready to stream. ``lsn`` is
    the last lsn shipped before the snapshot began (the follower pulls after it)."""
    parent = Path(data_dir) / SNAPSHOT_DIR
    parent.mkdir(exist_ok=True)
    with _active_lock:
        for leftover in parent.iterdir():
            if str(leftover) not in _active:
                shutil.rmtree(leftover, ignore_errors=True)
        root = Path(tempfile.mkdtemp(prefix="snap-", dir=parent))
        _active.add(str(root))
    try:
        queues = engine.snapshot(str(root))
        doc = {"epoch": epoch, "lsn": lsn, "queues": queues}
        (root / SNAPSHOT_JSON).write_text(json.dumps(doc, sort_keys=True))
    except BaseException:
        remove_snapshot(root)
        raise
    return root


def remove_snapshot(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    with _active_lock:
        _active.discard(str(root))


class _ChunkWriter:
    """The file object ``tarfile`` writes to: whole chunks go to the queue."""

    def __init__(self, out: queue.Queue[object], cancelled: threading.Event) -> None:
        self.out = out
        self.cancelled = cancelled
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        while len(self.buf) >= CHUNK_BYTES:
            self.put(bytes(self.buf[:CHUNK_BYTES]))
            del self.buf[:CHUNK_BYTES]
        return len(data)

    def put(self, item: object) -> None:
        while True:
            if self.cancelled.is_set():
                raise _Cancelled
            try:
                self.out.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                continue

    def finish(self) -> None:
        if self.buf:
            self.put(bytes(self.buf))
            self.buf.clear()


_END = object()


def _produce(root: Path, writer: _ChunkWriter) -> None:
    try:
        with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
            tar.add(root / SNAPSHOT_JSON, arcname=SNAPSHOT_JSON)
            queues = root / "queues"
            if queues.exists():
                tar.add(queues, arcname="queues")
        writer.finish()
        writer.put(_END)
    except _Cancelled:
        return
    except BaseException as exc:
        logger.error("snapshot stream of %s failed: %s", root, exc)
        with contextlib.suppress(_Cancelled):
            writer.put(exc)


async def tar_chunks(root: Path, on_failure: Callable[[], None]) -> AsyncIterator[bytes]:
    """The tar of ``root`` in chunks; ``root`` is removed afterwards, and ``on_failure``
    runs (in a thread) when the stream did not end complete."""
    out: queue.Queue[object] = queue.Queue(maxsize=_QUEUED)
    cancelled = threading.Event()
    producer = threading.Thread(
        target=_produce, args=(root, _ChunkWriter(out, cancelled)), name="dq-snapshot-tar"
    )
    producer.start()
    loop = asyncio.get_running_loop()
    complete = False
    try:
        while True:
            item = await loop.run_in_executor(_THREADS, _next, out, producer)
            if item is _END:
                complete = True
                return
            if isinstance(item, BaseException):
                raise RuntimeError(f"snapshot stream failed: {item}") from item
            assert isinstance(item, bytes)
            yield item
    finally:
        # No await here: the response's task may be cancelled (the follower went away).
        cancelled.set()
        threading.Thread(
            target=_clean_up,
            args=(root, producer, None if complete else on_failure),
            name="dq-snapshot-cleanup",
            daemon=True,
        ).start()


def _next(out: queue.Queue[object], producer: threading.Thread) -> object:
    while True:
        try:
            return out.get(timeout=_POLL_S)
        except queue.Empty:
            if not producer.is_alive() and out.empty():
                return RuntimeError("the snapshot producer ended without a result")


def _clean_up(
    root: Path, producer: threading.Thread, on_failure: Callable[[], None] | None
) -> None:
    producer.join(60.0)
    remove_snapshot(root)
    if on_failure is not None:
        try:
            on_failure()
        except Exception:
            logger.exception("after a failed snapshot stream")


def snapshot_dirs(data_dir: str) -> list[str]:
    """The snapshot directories present (tests check none is left behind)."""
    parent = Path(data_dir) / SNAPSHOT_DIR
    return sorted(os.listdir(parent)) if parent.exists() else []
