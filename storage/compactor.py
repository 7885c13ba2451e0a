"""Freezing logs into segment files and merging segment files: pure file-to-file work.

Both jobs are plain functions of paths so they can run in a worker process (the
default: a second core, no GIL contention with the serving process) or inline in
tests. Neither touches engine state; the queue installs their output afterwards.

Entries form a multiset per key: a pending entry counts +1, a tombstone -1. Freezing
cancels pairs within one log; merging sums counts across its inputs and writes the
net (pendings, or tombstones). A net tombstone is "rogue" (its pending lives in a
segment outside the merge) and is kept — unless the merge covers every older
segment (``drop_rogue``), in which case nothing it could cancel remains.
"""

from __future__ import annotations

import heapq
import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from dq.storage.codec import TOMBSTONE, decode_stats, key_id, tombstone_of
from dq.storage.itemmeta import groups_of, without_groups, write_sidecar
from dq.storage.segment import (
    SegmentReader,
    iter_entries_keys,
    segment_name,
    write_segment_grouped,
)
from dq.storage.wal import RECORD_HEADER, read_wal
from dq.storage.worker_wire import read_message, write_message

__all__ = [
    "CompactionCancelled",
    "Compactor",
    "FreezeResult",
    "freeze_log",
    "merge_segments",
    "net_entries",
]

log = logging.getLogger(__name__)


class CompactionCancelled(Exception):
    """A merge noticed its cancel marker and stopped (the engine is closing)."""


@dataclass(frozen=True)
class FreezeResult:
    segment_no: int
    path: str | None  # None: every entry cancelled, no file written


def freeze_log(log_path: str, directory: str) -> FreezeResult:
    """Write the sorted segment file for a ``*.log_ro``; cancel pairs inside it."""
    contents = read_wal(log_path)
    meta = b"".join(m for _, m in contents.meta)
    # item metadata outlives the log in a sidecar (storage/itemmeta.py); groups go into
    # the segment file's group column instead, with their entries
    kept = without_groups(meta, log_path)
    if kept:
        write_sidecar(directory, contents.segment_no, kept)
    groups = {} if not meta else groups_of(meta, log_path)
    entries: dict[bytes, bytes] = {}
    for offset, payload in contents.records:
        base = offset + RECORD_HEADER.size
        marks = [(key, off) for key, _s, _v, off in iter_entries_keys(payload, log_path, base)]
        for i, (key, off) in enumerate(marks):
            end = marks[i + 1][1] if i + 1 < len(marks) else len(payload)
            entries[key] = payload[off:end]
    keys = sorted(entries)
    max_id = contents.id_floor - 1

    def survivors() -> Iterator[tuple[bytes, bytes, str | None]]:
        i, n = 0, len(keys)
        while i < n:
            k = keys[i]
            if k[15] & 0b11 != TOMBSTONE and i + 1 < n and keys[i + 1] == tombstone_of(k):
                i += 2
                continue
            group = groups.get(key_id(k)) if groups and k[15] & 0b11 != TOMBSTONE else None
            yield k, entries[k], group
            i += 1

    if keys:
        max_id = max(max_id, max(key_id(k) for k in keys))
    no = contents.segment_no
    path = os.path.join(directory, segment_name(no, no))
    info = write_segment_grouped(path, survivors(), seg_lo=no, seg_hi=no, max_id=max(max_id, 0))
    return FreezeResult(no, path if info is not None else None)


def net_entries(
    stream: Iterable[tuple[bytes, bytes]], *, drop_rogue: bool
) -> Iterator[tuple[bytes, bytes]]:
    """Sum a key-sorted stream of entries per (deadline, id): emit the net multiset.

    For one (deadline, id), all pendings sort before all tombstones. If pendings
    outnumber tombstones the newest pending (by requeue time) is emitted that many
    times; if tombstones outnumber pendings they are emitted (unless ``drop_rogue``).
    """
    for key, encoded, _g in net_entries_grouped(
        ((k, e, None) for k, e in stream), drop_rogue=drop_rogue
    ):
        yield key, encoded


def net_entries_grouped(
    stream: Iterable[tuple[bytes, bytes, str | None]], *, drop_rogue: bool
) -> Iterator[tuple[bytes, bytes, str | None]]:
    """``net_entries`` of (key, entry, item group) triples: a surviving pending entry
    keeps its item's group (``docs/delivery.md``)."""
    run: bytes | None = None  # key[:15] plus the upper bits of the last byte
    pendings: list[tuple[bytes, str | None]] = []
    tombs = 0
    tomb_key = b""

    def flush() -> Iterator[tuple[bytes, bytes, str | None]]:
        net = len(pendings) - tombs
        if net > 0:
            newest, group = max(pendings, key=lambda e: decode_stats(e[0][16:32])[1])
            for _ in range(net):
                yield newest[:16], newest, group
        elif net < 0 and not drop_rogue:
            for _ in range(-net):
                yield tomb_key, tomb_key, None

    for key, encoded, item_group in stream:
        g = key[:15] + bytes((key[15] & 0b11111100,))
        if g != run:
            if run is not None:
                yield from flush()
            run, pendings, tombs = g, [], 0
        if key[15] & 0b11 == TOMBSTONE:
            tombs += 1
            tomb_key = key
        else:
            pendings.append((encoded, item_group))
    if run is not None:
        yield from flush()


def merge_segments(
    paths: list[str],
    directory: str,
    *,
    drop_rogue: bool,
    cancel_marker: str | None = None,
) -> str | None:
    """Merge segment files into one covering their whole range; return its path or None."""
    readers = [SegmentReader(p) for p in paths]
    try:
        lo = min(r.seg_lo for r in readers)
        hi = max(r.seg_hi for r in readers)
        max_id = max(r.info.max_id for r in readers)
        stream = heapq.merge(*(r.scan_grouped() for r in readers), key=_by_key)
        out = os.path.join(directory, segment_name(lo, hi))

        def checked() -> Iterator[tuple[bytes, bytes, str | None]]:
            for n, item in enumerate(net_entries_grouped(stream, drop_rogue=drop_rogue)):
                if cancel_marker and n % 4096 == 0 and os.path.exists(cancel_marker):
                    raise CompactionCancelled(out)
                yield item

        info = write_segment_grouped(out, checked(), seg_lo=lo, seg_hi=hi, max_id=max_id)
        return out if info is not None else None
    finally:
        for r in readers:
            r.close()


def _by_key(entry: tuple[bytes, bytes, str | None]) -> tuple[bytes, bytes]:
    """Merge order: by key, then the entry's bytes (as the pairs merged before groups)."""
    return entry[0], entry[1]


def _discard(proc: subprocess.Popen[bytes]) -> None:
    """Reap a worker that died (or broke its protocol) and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except OSError:  # a broken pipe may fail its final flush
                pass


class _WorkerProcess:
    """One ``python -m dq.storage.worker`` child, fed jobs in order by a dispatcher thread.

    The child is started by the dispatcher thread, which lives as long as the
    compactor, because ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the
    child exits.
    """

    def __init__(self, nice: int = 0) -> None:
        self.nice = nice
        self._jobs: queue.Queue[tuple[Future[Any], str, tuple[Any, ...], dict[str, Any]] | None] = (
            queue.Queue()
        )
        self._thread = threading.Thread(target=self._run, name="dq-compactor", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._jobs.put((fut, fn.__name__, args, kwargs))
        return fut

    def _spawn(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", "dq.storage.worker", str(os.getpid()), str(self.nice)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )

    def _run(self) -> None:
        proc: subprocess.Popen[bytes] | None = None
        n = 0
        while True:
            job = self._jobs.get()
            if job is None:
                break
            fut, name, args, kwargs = job
            if not fut.set_running_or_notify_cancel():
                continue
            n += 1
            try:
                if proc is None or proc.poll() is not None:
                    proc = self._spawn()
                assert proc.stdin is not None and proc.stdout is not None
                write_message(proc.stdin, (n, name, args, kwargs))
                reply = read_message(proc.stdout)
                if reply is None:
                    raise RuntimeError(f"compaction worker died (exit {proc.wait()})")
                _id, ok, value = reply
                if ok:
                    fut.set_result(value)
                else:
                    fut.set_exception(value)
            except BaseException as exc:
                if proc is not None:
                    _discard(proc)
                proc = None
                fut.set_exception(exc)
        if proc is not None:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            proc.stdout.close()

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=60)


class Compactor:
    """Runs freeze and merge jobs off the serving thread.

    ``mode`` is ``"process"`` (worker processes: a second core, no GIL contention with
    serving), ``"thread"`` (background threads) or ``"inline"`` (run in the caller:
    deterministic, for tests). Freezes and merges have a worker each, so a freeze —
    which frees memory — never waits behind a long merge.
    """

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._executors: dict[str, _WorkerProcess | ThreadPoolExecutor] = {}
        self._lock = threading.Lock()
        self._inflight: set[Future[Any]] = set()

    def _get(self, lane: str) -> _WorkerProcess | ThreadPoolExecutor:
        with self._lock:
            ex = self._executors.get(lane)
            if ex is None:
                if self.mode == "process":
                    # freezing frees memory: full priority; merging can wait
                    ex = _WorkerProcess(nice=5 if lane == "merge" else 0)
                else:
                    ex = ThreadPoolExecutor(1, thread_name_prefix=f"dq-{lane}")
                self._executors[lane] = ex
            return ex

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        if self.mode == "inline":
            fut: Future[Any] = Future()
            try:
                fut.set_result(fn(*args, **kwargs))
            except BaseException as exc:  # delivered to the done-callback
                fut.set_exception(exc)
            return fut
        lane = "merge" if fn is merge_segments else "freeze"
        fut = self._get(lane).submit(fn, *args, **kwargs)
        with self._lock:
            self._inflight.add(fut)
        fut.add_done_callback(self._done)
        return fut

    def _done(self, fut: Future[Any]) -> None:
        with self._lock:
            self._inflight.discard(fut)

    def wait_idle(self, timeout: float | None = None) -> None:
        with self._lock:
            pending = list(self._inflight)
        for fut in pending:
            try:
                fut.result(timeout)
            except Exception:  # reported by the job's own callback
                pass

    def shutdown(self) -> None:
        with self._lock:
            executors, self._executors = list(self._executors.values()), {}
        for ex in executors:
            if isinstance(ex, _WorkerProcess):
                ex.shutdown()
            else:
                ex.shutdown(wait=True, cancel_futures=False)
