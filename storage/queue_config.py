"""A queue's settings on disk: ``queue.json`` in the queue's directory.

Invariant: the file is replaced atomically (written beside, synced, renamed), so a
crash leaves either the old settings or the new ones, never a torn file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict

from dq.storage import fileio
from dq.storage.types import QueueConfig

__all__ = ["CONFIG_FILE", "load_config", "save_config"]

CONFIG_FILE = "queue.json"


def save_config(directory: str, config: QueueConfig) -> None:
    data = json.dumps({"version": 1, **asdict(config)}, sort_keys=True).encode()
    fileio.write_file_atomic(os.path.join(directory, CONFIG_FILE), data)


def load_config(directory: str) -> QueueConfig:
    with open(os.path.join(directory, CONFIG_FILE), "rb") as f:
        raw = json.loads(f.read())
    raw.pop("version", None)
    return QueueConfig(**raw)
