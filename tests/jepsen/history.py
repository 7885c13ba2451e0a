"""The history of one Jepsen-style run: what the clients asked, what came back, and what
the nemesis and the leader monitor saw, one JSON object per line (``history.jsonl``).

Times are wall-clock milliseconds of this machine, the clock the servers stamp
deadlines and leases with (every process of a run shares it). An operation has an
``invoke`` (just before the request was sent, rounded down) and a ``complete`` (just
after its answer, or its failure, arrived, rounded up), so "the server acted between
``invoke`` and ``complete``" always holds.

Event types (``type``):
  - ``enqueue``: ``value``, ``outcome`` (``ok`` / ``fail`` / ``unknown``), ``id`` and
    ``deadline`` when ok, ``error`` otherwise. ``fail`` only where the server says
    nothing was written (a refusal such as 421 or 400); a lost answer or a replication
    timeout is ``unknown``: the write may still commit.
  - ``deliver``: one item a dequeue handed out: ``value``, ``id``, ``deadline``,
    ``receipt``, ``lease_expires``.
  - ``release``: ``id``, ``value``, ``receipt``, ``outcome`` like enqueue's.
  - ``epoch``: the leader monitor saw a new epoch: ``t``, ``epoch``, ``node``.
  - ``nemesis``: a fault started or healed: ``t``, ``fault``, ``phase``, ``detail``.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["Event", "History", "load", "now_ceil", "now_floor"]

Event = dict[str, Any]


def now_floor() -> int:
    return math.floor(time.time() * 1000)


def now_ceil() -> int:
    return math.ceil(time.time() * 1000)


class History:
    """Thread-safe recorder: events are kept in memory and appended to a file as they
    come, so a run that dies still leaves what it saw."""

    def __init__(self, path: Path | None = None) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        self._file = path.open("a", encoding="utf-8") if path is not None else None

    def add(self, event: Event) -> None:
        line = json.dumps(event, separators=(",", ":"), sort_keys=True)
        with self._lock:
            self.events.append(event)
            if self._file is not None:
                self._file.write(line + "\n")

    def note(self, kind: str, **fields: Any) -> None:
        """An instantaneous event (``epoch``, ``nemesis``) stamped now."""
        self.add({"type": kind, "t": now_floor(), **fields})

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def snapshot(self) -> list[Event]:
        with self._lock:
            return list(self.events)


def load(path: Path) -> list[Event]:
    """Every event of a ``history.jsonl``; a torn last line (the run was killed while
    writing it) is skipped."""
    return list(_parse(path.read_text(encoding="utf-8").splitlines()))


def _parse(lines: Iterable[str]) -> Iterator[Event]:
    for line in lines:
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError:
            continue
