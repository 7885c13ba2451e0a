"""A queue's settings on disk: ``queue.json`` in the queue's directory.

Invariant: the file is replaced atomically (written beside, synced, renamed), so a
crash leaves either the old settings or the new ones, never a torn file.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from dq.storage import fileio
from dq.storage.errors import InvalidArgument
from dq.storage.retry import retry_from_json
from dq.storage.types import QueueConfig

__all__ = ["CONFIG_FILE", "config_from_json", "config_to_json", "load_config", "save_config"]

CONFIG_FILE = "queue.json"


def config_to_json(config: QueueConfig) -> dict[str, Any]:
    """The config as ``queue.json`` and a replica group's ``put_queue`` frame hold it
    (``retry`` in the shape the API shows: only its own fields)."""
    out = asdict(config)
    out["retry"] = None if config.retry is None else config.retry.to_json()
    return out


def config_from_json(raw: dict[str, Any]) -> QueueConfig:
    """``config_to_json`` read back (a file without ``retry``: no policy)."""
    fields = dict(raw)
    fields["retry"] = retry_from_json(fields.get("retry"))
    return QueueConfig(**fields)


def save_config(directory: str, config: QueueConfig) -> None:
    data = json.dumps({"version": 1, **config_to_json(config)}, sort_keys=True).encode()
    fileio.write_file_atomic(os.path.join(directory, CONFIG_FILE), data)


#: the JSON types of each setting as ``save_config`` writes them
_KINDS: dict[str, tuple[type, ...]] = {
    "default_lease_ms": (int,),
    "max_deliveries": (int, type(None)),
    "dead_letter_queue": (str, type(None)),
    "dedup_window_ms": (int,),
    "retry": (dict, type(None)),
}


def load_config(directory: str) -> QueueConfig:
    """The settings in ``queue.json``; ``ValueError`` (damage) for a file that parses
    but is not what ``save_config`` writes: loaded, a lease of ``"abc"`` would answer
    every dequeue with a client error, and a non-object would stop the engine opening."""
    with open(os.path.join(directory, CONFIG_FILE), "rb") as f:
        raw = json.loads(f.read())
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    raw.pop("version", None)
    for name, value in raw.items():
        kinds = _KINDS.get(name, ())
        if kinds and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise ValueError(f"{name} is {value!r}")
    try:
        return config_from_json(raw)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None
