"""The engine's own CPU per call, in process: what the server's event loop pays for
``enqueue_nowait``, ``dequeue`` and ``release_nowait``, and for the group commit it
runs itself afterwards (``sync_round``), per item.

Run from the repository root:  .venv/bin/python -m bench.engine_cpu [--batch 1 100]

The engine runs with ``fsync always`` as the server does, the group commit called on
the calling thread as the server's loop calls it (``Syncer.commit_inline``), and with
the listeners a server has: a counter per event (the telemetry ring's) and an event
listener nobody reads (the broadcast ring's). ``fdatasync`` is replaced by a no-op, so
the figures are the Python and the ``pwrite`` around the sync, not the disk.

Each figure is the 10th percentile over many short chunks of calls (wall time of one
thread, µs per item): on a shared machine most chunks are slowed by other processes,
the fastest ones are the code. ``--tree PATH`` measures another checkout of the
project (e.g. a ``git worktree`` of an older commit) with this script, so before and
after can alternate in one session.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_PACKAGES = ("storage", "server", "shm", "client", "cli", "pipeline")


def _use_tree(tree: str) -> str:
    """Import ``dq`` from ``tree``: a package directory of links to its parts, first on
    the path (an editable install's finder comes after the path's)."""
    root = tempfile.mkdtemp(prefix="dq-tree-")
    atexit.register(shutil.rmtree, root, True)
    pkg = Path(root) / "dq"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for name in _PACKAGES:
        if (Path(tree) / name).is_dir():
            (pkg / name).symlink_to(Path(tree).resolve() / name)
    sys.path.insert(0, root)
    return root


class _NoSync:
    """The compiled log calls (``dq.storage._wal``) as ``fileio`` sees them, with every
    ``fdatasync`` left out: a round's write stays the compiled one."""

    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def fdatasync(self, fd: int) -> None:
        pass

    def pwrite_fdatasync(self, fd: int, data: Any, offset: int) -> int:
        self._real.pwrite_all(fd, data, offset)
        return 0


def no_fdatasync(fileio: Any) -> None:
    """Make the engine's log syncs no-ops (a tree from before the compiled log calls
    syncs through ``fileio.fdatasync`` alone)."""
    fileio.fdatasync = lambda fd, path: None
    if hasattr(fileio, "_wal"):
        fileio._wal = _NoSync(fileio._wal)


class _Inline:
    """The loop's committing: writes only note their queue; the caller commits after
    (``sync_round``)."""

    def mark_dirty(self, target: object) -> None:
        pass

    def stop(self) -> None:
        pass


def committing_inline(data: str, **config: Any) -> Any:
    """An engine on ``data`` with ``fsync always`` whose group commit runs on the calling
    thread, as the server's loop runs it: its syncer thread is stopped and replaced, so
    each write waits for the caller's ``queue.sync_round()``."""
    from dq.storage import Engine, EngineConfig

    eng = Engine.open(data, EngineConfig(fsync="always", compaction="inline", **config))
    assert eng.syncer is not None
    eng.syncer.stop()
    eng.syncer = _Inline()
    return eng


def measure(batch: int, rounds: int, value_bytes: int) -> dict[str, float]:
    from dq.storage import fileio
    from dq.storage.types import NewItem, Release

    no_fdatasync(fileio)
    data = tempfile.mkdtemp(prefix="dq-engine-cpu-")
    try:
        eng = committing_inline(data)
        counts: collections.Counter[tuple[str, str]] = collections.Counter()
        lock = threading.Lock()

        def count(queue: str, kind: str, n: int) -> None:
            with lock:
                counts[(queue, kind)] += max(1, n)

        if hasattr(eng, "on_count"):
            eng.on_count(count)
            eng.on_event(lambda ev: None, wanted=lambda: False)
        else:  # an engine from before counters: the telemetry counted events
            eng.on_event(lambda ev: count(ev.queue, ev.kind, len(ev.ids)))
            eng.on_event(lambda ev: None)
        eng.ensure_queue("q")
        q = eng.queue("q")
        items = [NewItem(b"v" * value_bytes) for _ in range(batch)]
        calls = max(1, 40 // batch)
        pc = time.perf_counter
        got: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(rounds):
            call = commit = 0.0
            for _ in range(calls):
                t0 = pc()
                fut = eng.enqueue_nowait("q", items)
                t1 = pc()
                q.sync_round()
                t2 = pc()
                fut.result(0)
                call, commit = call + t1 - t0, commit + t2 - t1
            got["enqueue"].append(call)
            got["enqueue commit"].append(commit)
            t0 = pc()
            leased = [eng.dequeue("q", batch, None) for _ in range(calls)]
            got["dequeue"].append(pc() - t0)
            call = commit = 0.0
            for deliveries in leased:
                done = [Release(d.id, d.receipt) for d in deliveries]
                t0 = pc()
                fut = eng.release_nowait("q", done)
                t1 = pc()
                q.sync_round()
                t2 = pc()
                fut.result(0)
                call, commit = call + t1 - t0, commit + t2 - t1
            got["release"].append(call)
            got["release commit"].append(commit)
        eng.close()
        per = 1e6 / calls / batch
        return {k: sorted(v)[len(v) // 10] * per for k, v in got.items()}
    finally:
        shutil.rmtree(data, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 100], help="items per call")
    ap.add_argument("--rounds", type=int, default=150, help="chunks of calls per figure")
    ap.add_argument("--value-bytes", type=int, default=256)
    ap.add_argument("--tree", help="measure the project checked out at this path")
    args = ap.parse_args()
    if args.tree:
        _use_tree(args.tree)
    import dq.storage

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    where = Path(dq.storage.__file__).resolve().parents[1]
    print(f"engine from {where}, load average {load}", flush=True)
    for batch in args.batch:
        figures: dict[str, Any] = measure(batch, args.rounds, args.value_bytes)
        line = " | ".join(f"{k} {v:.1f}" for k, v in figures.items())
        print(f"batch {batch:>3}: µs per item: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
