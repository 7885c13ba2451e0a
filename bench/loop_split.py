"""``dq serve`` with CPU probes on the event loop thread: where a request's time goes.

Not run by hand: ``bench/server_cpu.py --split`` starts the server as
``python -m bench.loop_split serve ...`` from the repository root. Before the server
starts, the calls below are wrapped so each adds the thread CPU time it took
(``time.thread_time``, user + system, so the kernel's share of a socket write counts)
and its count to a table; on ``SIGUSR1`` the table is written as JSON to
``$DQ_LOOP_SPLIT`` (the bench signals before and after each phase and takes the
difference). Nested parts are counted inside their callers too:

- ``parse+dispatch``: ``DqHttpProtocol.data_received`` — the httptools parser's callbacks,
  validation, the engine call and, for an answer that is ready at once (a dequeue), the
  answer's write;
- ``durable answers``: ``Completions._drain`` — the answers of writes a group commit made
  durable, their writes included;
- ``answer write``: ``DqHttpProtocol._reply`` — the head and one ``transport.write``
  (the kernel's loopback TCP work for the reader is charged here);
- ``engine.*``: the engine's own calls on the loop thread; ``syncer wake-up`` is the
  part of a durable write that notes its queue for the next group commit
  (``Syncer.mark_dirty``);
- ``group commit``: ``InlineCommits.commit`` — a group commit run on the loop thread:
  the log's write and fdatasync, publishing, and the durable answers with their
  writes; ``log write`` and ``fdatasync`` are its system calls (``WalWriter.write``,
  ``WalWriter.sync``; their CPU, not the wait for the disk).

The probe costs a ``clock_gettime`` pair per wrapped call (~1-2 µs each on a VM): the
split says where the time goes, the whole-process figures come from runs without it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_table: dict[str, list[float]] = {}


def _wrap(owner: Any, name: str, label: str) -> None:
    inner: Callable[..., Any] = getattr(owner, name)
    clock = time.thread_time
    slot = _table.setdefault(label, [0.0, 0])

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = clock()
        try:
            return inner(*args, **kwargs)
        finally:
            slot[0] += clock() - t0
            slot[1] += 1

    setattr(owner, name, timed)


def _dump(_signum: int, _frame: Any) -> None:
    out = os.environ.get("DQ_LOOP_SPLIT")
    if out:
        tmp = Path(out + ".tmp")
        tmp.write_text(json.dumps({k: [s, n] for k, (s, n) in _table.items()}))
        tmp.replace(out)


def main() -> int:
    from dq.cli.main import main as dq_main
    from dq.server.completions import Completions
    from dq.server.protocol import DqHttpProtocol
    from dq.storage.engine import Engine
    from dq.storage.syncer import InlineCommits, Syncer
    from dq.storage.wal import WalWriter

    _wrap(DqHttpProtocol, "data_received", "parse+dispatch")
    _wrap(Completions, "_drain", "durable answers")
    _wrap(DqHttpProtocol, "_reply", "answer write")
    _wrap(Engine, "enqueue_nowait", "engine.enqueue_nowait")
    _wrap(Engine, "release_nowait", "engine.release_nowait")
    _wrap(Engine, "dequeue", "engine.dequeue")
    _wrap(Syncer, "mark_dirty", "syncer wake-up")
    _wrap(InlineCommits, "commit", "group commit")
    _wrap(WalWriter, "write", "log write")
    _wrap(WalWriter, "sync", "fdatasync")
    signal.signal(signal.SIGUSR1, _dump)
    return dq_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
