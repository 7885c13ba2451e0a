"""A queue's operator state: whether it is paused, and since when.

Kept apart from ``queue.json`` (the config a client PUTs) so that replacing the config
never resumes a queue, and pausing never rewrites the config. Written atomically
(``state.json.tmp``, fsync, rename), so a pause survives SIGKILL once answered.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from dq.storage import fileio

__all__ = ["STATE_FILE", "QueueState", "load_state", "save_state"]

STATE_FILE = "state.json"


@dataclass(slots=True)
class QueueState:
    #: ms since the epoch when the queue was paused; None while it runs
    paused_since: int | None = None

    @property
    def paused(self) -> bool:
        return self.paused_since is not None


def load_state(directory: str) -> QueueState:
    try:
        with open(os.path.join(directory, STATE_FILE), "rb") as f:
            raw = json.loads(f.read())
    except FileNotFoundError:
        return QueueState()
    # a file that parses as something else is damage (ValueError), not a crash of the
    # engine's start
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    since = raw.get("paused_since")
    if isinstance(since, bool) or not isinstance(since, int | None):
        raise ValueError(f"paused_since is {since!r}")
    return QueueState(paused_since=since)


def save_state(directory: str, state: QueueState) -> None:
    data = json.dumps({"version": 1, "paused_since": state.paused_since}).encode()
    fileio.write_file_atomic(os.path.join(directory, STATE_FILE), data)
