"""Schedule routes: ``/v1/queues/{queue}/schedules[/{name}[/pause|resume|run]]``.

Each is a thin shell over one ``Engine`` call (``storage/schedules.py``), run in a worker
thread (a definition is written and fsynced, and on a replica group's leader waits for
the sync set, before it is answered). The JSON of a schedule is built in one place,
``schedule_json``, for the single and the list answers alike; the lateness of its last
tick comes from this server's scheduler (``app.state.scheduler``), which fires only while
the server takes writes.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response

from dq.server.dependencies import QueuePath, service_of
from dq.server.routers._common import ERRORS, in_thread, json_response
from dq.server.schedule_schemas import (
    ScheduleBody,
    ScheduleList,
    ScheduleOut,
    SchedulePage,
    ScheduleRun,
)
from dq.server.schemas import decode_value, encode_value
from dq.storage.errors import InvalidSchedule
from dq.storage.schedules import ScheduleInfo, ScheduleSpec

__all__ = ["every_queue", "router", "schedule_json"]

router = APIRouter(prefix="/v1/queues/{queue}/schedules", tags=["schedules"], responses=ERRORS)
#: every queue's schedules, a page at a time (the dashboard's Schedules page)
every_queue = APIRouter(prefix="/v1/schedules", tags=["schedules"], responses=ERRORS)
NamePath = Annotated[
    str,
    Path(
        description="schedule name",
        json_schema_extra={"pattern": r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}$"},
    ),
]


def schedule_json(info: ScheduleInfo, lateness_ms: int | None) -> dict[str, Any]:
    s = info.schedule
    t = s.timing
    value, encoding = encode_value(s.value, None)
    return {
        "queue": s.queue,
        "name": s.name,
        "cron": t.cron,
        "every_ms": t.every_ms,
        "at": t.at,
        "timezone": t.timezone,
        "start": t.start,
        "end": t.end,
        "catch_up": s.catch_up,
        "paused": s.paused,
        "value": value,
        "encoding": encoding,
        "group": s.group,
        "created": s.created,
        "changed": s.since,
        "last_tick": info.last_tick,
        "fired": info.fired,
        "next": info.next,
        "lateness_ms": lateness_ms,
    }


def _lateness(request: Request, queue: str, name: str) -> int | None:
    scheduler = getattr(request.app.state, "scheduler", None)
    return None if scheduler is None else scheduler.lateness_ms(queue, name)


def _answer(request: Request, info: ScheduleInfo) -> Response:
    s = info.schedule
    return json_response(schedule_json(info, _lateness(request, s.queue, s.name)))


def _spec(body: ScheduleBody) -> ScheduleSpec:
    try:
        value = decode_value(body.value, body.encoding)
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidSchedule(str(exc), field="value") from None
    return ScheduleSpec(
        cron=body.cron,
        every_ms=body.every_ms,
        at=body.at,
        timezone=body.timezone,
        start=body.start,
        end=body.end,
        value=value,
        group=body.group,
        catch_up=body.catch_up,
        paused=body.paused,
    )


async def _set_paused(request: Request, queue: str, name: str, paused: bool) -> Response:
    service = service_of(request)
    op = "schedule_pause" if paused else "schedule_resume"
    info = await in_thread(
        service, op, lambda: service.engine.set_schedule_paused(queue, name, paused)
    )
    return _answer(request, info)


@router.put("/{name}", response_model=ScheduleOut, summary="Create a schedule or replace it")
async def put_schedule(
    queue: QueuePath, name: NamePath, body: ScheduleBody, request: Request
) -> Response:
    service = service_of(request)
    engine = service.engine
    info = await in_thread(
        service, "schedule_put", lambda: engine.put_schedule(queue, name, _spec(body))
    )
    return _answer(request, info)


@router.get("", response_model=ScheduleList, summary="The queue's schedules")
async def list_schedules(queue: QueuePath, request: Request) -> Response:
    service = service_of(request)
    infos = await in_thread(service, "schedule_get", lambda: service.engine.list_schedules(queue))
    return json_response(
        {"schedules": [schedule_json(i, _lateness(request, queue, i.schedule.name)) for i in infos]}
    )


@every_queue.get(
    "", response_model=SchedulePage, summary="Every queue's schedules, a page at a time"
)
async def all_schedules(
    request: Request,
    after: Annotated[
        str | None, Query(description="the next page's cursor: queue/name of the last one")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    service = service_of(request)
    cursor = None
    if after:
        queue, _, name = after.partition("/")
        cursor = (queue, name)
    infos, more = await in_thread(
        service, "schedule_get", lambda: service.engine.schedules_page(cursor, limit)
    )
    return json_response(
        {
            "schedules": [
                schedule_json(i, _lateness(request, i.schedule.queue, i.schedule.name))
                for i in infos
            ],
            "next": None if more is None else f"{more[0]}/{more[1]}",
        }
    )


@router.get("/{name}", response_model=ScheduleOut, summary="A schedule, its progress and next runs")
async def get_schedule(queue: QueuePath, name: NamePath, request: Request) -> Response:
    service = service_of(request)
    info = await in_thread(
        service, "schedule_get", lambda: service.engine.schedule_info(queue, name)
    )
    return _answer(request, info)


@router.delete("/{name}", status_code=204, summary="Delete a schedule (its items stay)")
async def delete_schedule(queue: QueuePath, name: NamePath, request: Request) -> Response:
    service = service_of(request)
    await in_thread(service, "schedule_delete", lambda: service.engine.delete_schedule(queue, name))
    return Response(status_code=204)


@router.post("/{name}/pause", response_model=ScheduleOut, summary="Pause: fire nothing")
async def pause_schedule(queue: QueuePath, name: NamePath, request: Request) -> Response:
    return await _set_paused(request, queue, name, True)


@router.post(
    "/{name}/resume",
    response_model=ScheduleOut,
    summary="Resume: fire the ticks from now on (not those that passed while paused)",
)
async def resume_schedule(queue: QueuePath, name: NamePath, request: Request) -> Response:
    return await _set_paused(request, queue, name, False)


@router.post(
    "/{name}/run",
    response_model=ScheduleRun,
    summary="Enqueue the schedule's item now, outside its ticks",
)
async def run_schedule(queue: QueuePath, name: NamePath, request: Request) -> Response:
    service = service_of(request)
    done, key = await in_thread(
        service, "schedule_run", lambda: service.engine.run_schedule(queue, name)
    )
    return json_response({"id": done.id, "deadline": done.deadline, "key": key})
