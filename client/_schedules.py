"""A queue's schedules from the client: the ``Schedule`` and ``ScheduleRun`` types, and
one ``Call`` per operation (``client/_calls.py``'s shape), which ``Client`` and
``AsyncClient`` hand to their transport (over shared memory too: the ring carries no
schedule call, so it passes them to HTTP whole).

The wire shapes are ``docs/http.md``, "Schedules"; what the server does with them,
``docs/schedules.md``. Times given as ``datetime`` go as ms when they carry a zone and as
ISO 8601 text (a wall-clock time of the schedule's ``timezone``) when they do not.

Invariants: building a call sends nothing and refuses only what the path cannot carry
(a queue or schedule name with a ``/``); every definition's meaning is the server's to
judge (a bad one is ``BadRequest``, code ``invalid_schedule``, naming the field).
PUT, GET, pause and resume are idempotent; DELETE and run are not.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

from dq.client._calls import Call, queue_path
from dq.client.errors import BadRequest

__all__ = [
    "DeleteSchedule",
    "GetSchedule",
    "ListSchedules",
    "PauseSchedule",
    "PutSchedule",
    "RunSchedule",
    "Schedule",
    "ScheduleRun",
    "When",
    "parse_schedule",
]

#: a time as the API takes it: ms since the epoch, ISO 8601 text, or a ``datetime``
When = int | str | datetime


@dataclass(frozen=True, slots=True)
class Schedule:
    """A schedule as the server shows it: its definition (exactly one of ``cron``,
    ``every_ms``, ``at``), what it has fired (``last_tick`` None: nothing yet) and its
    next fire times (``next``: five, none while paused). Times are ms since the epoch;
    ``lateness_ms``: tick to item durable of the last tick the answering server fired
    (None on a replica group's follower)."""

    queue: str
    name: str
    cron: str | None
    every_ms: int | None
    at: int | None
    timezone: str
    start: int | None
    end: int | None
    catch_up: str
    paused: bool
    value: bytes
    group: str | None
    created: int
    changed: int
    last_tick: int | None
    fired: int
    next: list[int]
    lateness_ms: int | None


@dataclass(frozen=True, slots=True)
class ScheduleRun:
    """The item ``run_schedule`` enqueued: its id, deadline (now) and key."""

    id: int
    deadline: int
    key: str


def parse_schedule(doc: Any) -> Schedule:
    value = doc["value"]
    raw = base64.b64decode(value) if doc["encoding"] == "base64" else value.encode("utf-8")
    return Schedule(
        queue=doc["queue"],
        name=doc["name"],
        cron=doc["cron"],
        every_ms=doc["every_ms"],
        at=doc["at"],
        timezone=doc["timezone"],
        start=doc["start"],
        end=doc["end"],
        catch_up=doc["catch_up"],
        paused=doc["paused"],
        value=raw,
        group=doc.get("group"),
        created=doc["created"],
        changed=doc["changed"],
        last_tick=doc["last_tick"],
        fired=doc["fired"],
        next=list(doc["next"]),
        lateness_ms=doc["lateness_ms"],
    )


def _when(value: When | None) -> int | str | None:
    if isinstance(value, datetime):
        if value.tzinfo is None:  # a wall-clock time of the schedule's zone
            return value.isoformat()
        return int(value.timestamp() * 1000)
    return value


def _path(queue: str, name: str) -> str:
    if not name or "/" in name:
        raise BadRequest(
            400,
            "invalid_schedule",
            f"schedule names match [A-Za-z0-9._-]{{1,100}} and do not start with '.' "
            f"(name={name!r})",
            queue=queue,
        )
    return f"{queue_path(queue)}/schedules/{quote(name, safe='')}"


class PutSchedule(Call[Schedule]):
    """Create the schedule (and its queue), or replace its definition (its progress
    stays)."""

    __slots__ = ("body",)

    method = "PUT"

    def __init__(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None,
        every_ms: int | None,
        at: When | None,
        timezone: str,
        value: bytes | str,
        group: str | None,
        catch_up: str,
        start: When | None,
        end: When | None,
        paused: bool,
    ) -> None:
        raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
        try:
            body: dict[str, Any] = {"value": raw.decode("utf-8"), "encoding": "utf-8"}
        except UnicodeDecodeError:
            body = {"value": base64.b64encode(raw).decode("ascii"), "encoding": "base64"}
        for field, given in (
            ("cron", cron),
            ("every_ms", every_ms),
            ("at", _when(at)),
            ("start", _when(start)),
            ("end", _when(end)),
            ("group", group),
        ):
            if given is not None:
                body[field] = given
        body.update(timezone=timezone, catch_up=catch_up, paused=paused)
        self.path = _path(queue, name)
        self.queue = queue
        self.idempotent = True
        self.body = body

    def json(self) -> Any:
        return self.body

    def decode(self, doc: Any) -> Schedule:
        return parse_schedule(doc)


class GetSchedule(Call[Schedule]):
    __slots__ = ()

    def __init__(self, queue: str, name: str) -> None:
        self.path = _path(queue, name)
        self.queue = queue
        self.idempotent = True

    def decode(self, doc: Any) -> Schedule:
        return parse_schedule(doc)


class ListSchedules(Call[list[Schedule]]):
    """The queue's schedules, by name."""

    __slots__ = ()

    def __init__(self, queue: str) -> None:
        self.path = queue_path(queue) + "/schedules"
        self.queue = queue
        self.idempotent = True

    def decode(self, doc: Any) -> list[Schedule]:
        return [parse_schedule(s) for s in doc["schedules"]]


class DeleteSchedule(Call[None]):
    """It fires no more; the items it enqueued stay."""

    __slots__ = ()

    method = "DELETE"

    def __init__(self, queue: str, name: str) -> None:
        self.path = _path(queue, name)
        self.queue = queue
        self.idempotent = False


class PauseSchedule(Call[Schedule]):
    """Pause the schedule, or resume it (``resume``): either is idempotent."""

    __slots__ = ()

    method = "POST"

    def __init__(self, queue: str, name: str, resume: bool = False) -> None:
        self.path = _path(queue, name) + ("/resume" if resume else "/pause")
        self.queue = queue
        self.idempotent = True

    def decode(self, doc: Any) -> Schedule:
        return parse_schedule(doc)


class RunSchedule(Call[ScheduleRun]):
    """Enqueue the schedule's item now, outside its ticks."""

    __slots__ = ()

    method = "POST"

    def __init__(self, queue: str, name: str) -> None:
        self.path = _path(queue, name) + "/run"
        self.queue = queue
        self.idempotent = False

    def decode(self, doc: Any) -> ScheduleRun:
        return ScheduleRun(doc["id"], doc["deadline"], doc["key"])
