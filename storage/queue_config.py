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
from dq.storage.errors import BrokenRule, InvalidArgument
from dq.storage.retry import retry_from_json
from dq.storage.types import QueueConfig, RateLimit
from dq.storage.validation import BURST, GROUP_LIMIT, LEASED_LIMIT, PER_SECOND

__all__ = [
    "CONFIG_FILE",
    "check_rules",
    "config_from_json",
    "config_to_json",
    "load_config",
    "save_config",
]

CONFIG_FILE = "queue.json"


def config_to_json(config: QueueConfig) -> dict[str, Any]:
    """The config as ``queue.json`` and a replica group's ``put_queue`` frame hold it
    (``retry`` in the shape the API shows: only its own fields)."""
    out = asdict(config)
    out["retry"] = None if config.retry is None else config.retry.to_json()
    return out


def config_from_json(raw: dict[str, Any]) -> QueueConfig:
    """``config_to_json`` read back (a file without ``retry``: no policy; without the
    delivery rules: none)."""
    fields = dict(raw)
    fields["retry"] = retry_from_json(fields.get("retry"))
    rate = fields.get("rate_limit")
    if isinstance(rate, dict):
        fields["rate_limit"] = RateLimit(**rate)
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
    "group_limit": (int, type(None)),
    "leased_limit": (int, type(None)),
    "fair": (bool,),
    "rate_limit": (dict, type(None)),
}
#: the JSON types of a ``rate_limit``'s fields
_RATE_KINDS: dict[str, tuple[type, ...]] = {
    "per_second": (int, float),
    "burst": (int,),
    "per_group": (bool,),
}


def _check_kinds(raw: dict[str, object], kinds_of: dict[str, tuple[type, ...]]) -> None:
    for name, value in raw.items():
        kinds = kinds_of.get(name, ())
        # a bool is an int to Python, but no int setting is written as one
        if kinds and (
            (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds)
        ):
            raise ValueError(f"{name} is {value!r}")


def load_config(directory: str) -> QueueConfig:
    """The settings in ``queue.json``; ``ValueError`` (damage) for a file that parses
    but is not what ``save_config`` writes: loaded, a lease of ``"abc"`` would answer
    every dequeue with a client error, and a non-object would stop the engine opening."""
    with open(os.path.join(directory, CONFIG_FILE), "rb") as f:
        raw = json.loads(f.read())
    if not isinstance(raw, dict):
        raise ValueError(f"not a JSON object but {type(raw).__name__}")
    raw.pop("version", None)
    _check_kinds(raw, _KINDS)
    rate = raw.get("rate_limit")
    if isinstance(rate, dict):
        _check_kinds(rate, _RATE_KINDS)
    try:
        return config_from_json(raw)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None


#: what ``fair`` and ``per_group`` are
_FLAG = "{} must be true or false"


def check_rules(config: QueueConfig) -> None:
    """A queue's delivery rules are within their ranges (``OutOfRange``, or
    ``BrokenRule`` for a value of the wrong kind), worded as every path words them."""
    for rule, value in ((GROUP_LIMIT, config.group_limit), (LEASED_LIMIT, config.leased_limit)):
        if value is not None:
            rule.check(value)
    if type(config.fair) is not bool:
        raise BrokenRule(_FLAG.format("fair"), "fair")
    rate = config.rate_limit
    if rate is None:
        return
    if not isinstance(rate, RateLimit):
        raise BrokenRule(
            'rate_limit must be {"per_second": number, "burst": int, "per_group": bool} or null',
            "rate_limit",
        )
    PER_SECOND.check(rate.per_second)
    BURST.check(rate.burst)
    if type(rate.per_group) is not bool:
        raise BrokenRule(_FLAG.format("per_group"), "per_group")
