"""The JSON shapes of the schedule routes (``server/routers/schedules.py``).

The request model checks types only (a wrong type is a 422 ``validation_error``); what a
definition means — a zone that exists, a cron that parses and fires, an interval not
under the server's minimum, a known ``catch_up`` — is the engine's to judge
(``storage/schedules.py``), so every front end refuses the same things with the same
400 ``invalid_schedule`` naming the field. Times are ms since the epoch in answers; a
request may give ``at``, ``start`` and ``end`` as ISO 8601 text too (without an offset,
a wall-clock time of ``timezone``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from dq.server.schemas import Encoding

__all__ = ["ScheduleBody", "ScheduleList", "ScheduleOut", "SchedulePage", "ScheduleRun"]

_TIME_DOC = "ms since the epoch, or ISO 8601 text (no offset: a wall time of timezone)"


class ScheduleBody(BaseModel):
    """A schedule's definition: exactly one of ``cron``, ``every_ms``, ``at``."""

    model_config = ConfigDict(extra="forbid")

    cron: str | None = Field(
        None,
        description="five fields (minute hour day month weekday) or six (seconds first)",
        examples=["0 9 * * MON-FRI"],
    )
    every_ms: int | None = Field(None, description="fire every this many ms (>= 1000)")
    at: int | str | None = Field(None, description=f"fire once, then: {_TIME_DOC}")
    timezone: str = Field("UTC", description="IANA zone of cron's wall clock and local times")
    value: str = Field("", description="the value of each item enqueued")
    encoding: Encoding = "utf-8"
    group: str | None = Field(None, description="the group of each item (docs/delivery.md)")
    catch_up: str = Field(
        "latest",
        description="ticks missed while no server fired: skip, latest (one item for the "
        "latest) or all (each, the newest 1,000 at most)",
    )
    start: int | str | None = Field(None, description=f"no tick before: {_TIME_DOC}")
    end: int | str | None = Field(None, description=f"no tick after: {_TIME_DOC}")
    paused: bool = False


class ScheduleOut(BaseModel):
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
    value: str
    encoding: Encoding
    group: str | None
    created: int = Field(description="when the schedule was made (ms)")
    changed: int = Field(description="when its definition last changed; ticks before are not its")
    last_tick: int | None = Field(description="the last tick it fired (null: none yet)")
    fired: int = Field(description="ticks it has fired")
    next: list[int] = Field(description="its next five fire times (none while paused)")
    lateness_ms: int | None = Field(
        description="tick to item durable, of the last tick this server fired (null: none)"
    )


class ScheduleList(BaseModel):
    schedules: list[ScheduleOut]


class SchedulePage(BaseModel):
    schedules: list[ScheduleOut]
    next: str | None = Field(description="cursor of the next page (pass as after); null at the end")


class ScheduleRun(BaseModel):
    id: int
    deadline: int
    key: str
