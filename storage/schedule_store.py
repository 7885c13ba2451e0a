"""Schedule definitions on disk: one file per schedule in its queue's directory.

    queues/<queue>/schedule.<name>.json

Each file is written like ``queue.json`` (``*.tmp``, fsync, rename, directory fsync),
so a definition is durable before its change is answered, and changing one schedule
costs one small file whatever the number of schedules (a file for all of them would be
rewritten whole at every change). Files sit beside the queue's own, so deleting the
queue deletes its schedules, and a replica group's snapshot and a backup copy them with
the queue (both copy a queue directory's ``.json`` files). A replica group's followers
get each change as a control frame (``storage/schedules.py``) and write the same file.

What a schedule has *fired* is not here: it travels in the log records of its items
(``storage/itemmeta.py``), exactly as durable as they are.
"""

from __future__ import annotations

import base64
import json
import os
import re
from dataclasses import dataclass

from dq.storage import fileio
from dq.storage.errors import InvalidSchedule
from dq.storage.schedule_times import Timing

__all__ = [
    "CATCH_UP",
    "SCHEDULE_NAME_PATTERN",
    "Schedule",
    "check_schedule_name",
    "decode",
    "encode",
    "file_name",
    "is_schedule_file",
    "load_all",
    "remove",
    "save",
]

#: what a schedule does with the ticks it missed while no server fired it
CATCH_UP = ("skip", "latest", "all")
#: names make file names and item keys (``schedule:{name}:{tick_ms}``, at most 128
#: bytes with 13 digits of ms): the queue-name alphabet, at most 100 characters
SCHEDULE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
_FILE = re.compile(r"schedule\.([A-Za-z0-9_-][A-Za-z0-9._-]{0,99})\.json")
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Schedule:
    """One named schedule of a queue.

    ``id`` names this incarnation of the name: kept when the definition is replaced,
    new when the name is deleted and made again, so the progress a deleted schedule
    left in the log never counts for a new one. ``since``: when the definition last
    changed (made, replaced, paused, resumed); ticks before it are not this
    definition's and never fire."""

    queue: str
    name: str
    id: int
    timing: Timing
    value: bytes
    catch_up: str
    paused: bool
    created: int
    since: int
    #: the group of each item it enqueues (``docs/delivery.md``; None: none)
    group: str | None = None


def check_schedule_name(name: object) -> str:
    if not isinstance(name, str) or SCHEDULE_NAME_PATTERN.fullmatch(name) is None:
        raise InvalidSchedule(
            "schedule names match [A-Za-z0-9._-]{1,100} and do not start with '.'",
            field="name",
        )
    return name


def file_name(name: str) -> str:
    return f"schedule.{name}.json"


def is_schedule_file(file: str) -> bool:
    """``file`` (a name in a queue's directory) holds a schedule's definition."""
    return _FILE.fullmatch(file) is not None


def encode(s: Schedule) -> dict[str, object]:
    """The definition as its file (and its replication frame) holds it."""
    t = s.timing
    return {
        "version": _VERSION,
        "name": s.name,
        "id": s.id,
        "cron": t.cron,
        "every_ms": t.every_ms,
        "at": t.at,
        "timezone": t.timezone,
        "start": t.start,
        "end": t.end,
        "value": base64.b64encode(s.value).decode("ascii"),
        "group": s.group,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "created": s.created,
        "since": s.since,
    }


def _int_or_none(raw: dict[str, object], field: str) -> int | None:
    v = raw.get(field)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{field} is {v!r}")
    return v


def decode(queue: str, raw: object) -> Schedule:
    """A definition read back (a file, a frame); ``ValueError`` if it is not one."""
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    name = raw.get("name")
    if not isinstance(name, str) or SCHEDULE_NAME_PATTERN.fullmatch(name) is None:
        raise ValueError(f"name is {name!r}")
    cron = raw.get("cron")
    if cron is not None and not isinstance(cron, str):
        raise ValueError(f"cron is {cron!r}")
    tz = raw.get("timezone")
    if not isinstance(tz, str):
        raise ValueError(f"timezone is {tz!r}")
    timing = Timing(
        cron=_intern(cron) if cron is not None else None,
        every_ms=_int_or_none(raw, "every_ms"),
        at=_int_or_none(raw, "at"),
        timezone=_intern(tz),
        start=_int_or_none(raw, "start"),
        end=_int_or_none(raw, "end"),
    )
    if sum(x is not None for x in (timing.cron, timing.every_ms, timing.at)) != 1:
        raise ValueError("not exactly one of cron, every_ms, at")
    value = raw.get("value")
    catch_up = raw.get("catch_up")
    if not isinstance(value, str) or catch_up not in CATCH_UP:
        raise ValueError("value or catch_up missing")
    group = raw.get("group")
    if group is not None and not isinstance(group, str):
        raise ValueError(f"group is {group!r}")
    sid, created, since = (_int_or_none(raw, f) for f in ("id", "created", "since"))
    if sid is None or created is None or since is None:
        raise ValueError("id, created or since missing")
    return Schedule(
        queue=queue,
        name=name,
        id=sid,
        timing=timing,
        value=base64.b64decode(value, validate=True),
        catch_up=str(catch_up),
        paused=bool(raw.get("paused")),
        created=created,
        since=since,
        group=None if group is None else _intern(group),
    )


def save(directory: str, s: Schedule) -> None:
    data = json.dumps(encode(s), separators=(",", ":")).encode()
    fileio.write_file_atomic(os.path.join(directory, file_name(s.name)), data)


def remove(directory: str, name: str) -> None:
    path = os.path.join(directory, file_name(name))
    if os.path.exists(path):
        fileio.remove(path)
        fileio.fsync_dir(directory)


def load_all(queue: str, directory: str) -> tuple[dict[str, Schedule], list[str]]:
    """Every definition in the queue's directory, and a line per file that could not be
    read (left on disk as it is, for an operator to mend or remove)."""
    out: dict[str, Schedule] = {}
    problems: list[str] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out, problems
    for fname in names:
        m = _FILE.fullmatch(fname)
        if m is None:
            continue
        path = os.path.join(directory, fname)
        try:
            with open(path, "rb") as f:
                s = decode(queue, json.loads(f.read()))
            if s.name != m.group(1):
                raise ValueError(f"the file holds schedule {s.name!r}")
        except (OSError, ValueError, TypeError) as exc:
            problems.append(f"{path}: {exc}")
            continue
        out[s.name] = s
    return out, problems


_interned: dict[str, str] = {}


def _intern(text: str) -> str:
    """One string object per distinct cron expression or zone (100,000 schedules
    mostly share a few)."""
    return _interned.setdefault(text, text)
