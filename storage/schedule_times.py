"""When a schedule fires: its ticks, from a cron expression, a fixed interval or one
time, in an IANA time zone, between an optional start and end.

A tick is an instant (ms since the epoch, UTC). How each kind makes them:

- ``cron``: five fields (minute hour day-of-month month day-of-week), or six with the
  seconds first (``*/15 * * * * *``), matched against the *wall clock* of ``timezone``.
  Daylight saving, the same rule for every expression however often it fires: a wall
  time that does not exist (the hour skipped in spring) fires once, at the next valid
  instant (the moment the clocks jump: a 02:30 daily job in Europe/Berlin fires at
  03:00 CEST that day, and the 02:00, 02:30 and 03:00 of ``*/30`` are one tick); a
  wall time that happens twice (the hour repeated in autumn) fires once, at its first
  occurrence (the repeated hour's second pass fires nothing). So the wall clock of the
  zone is what an operator reads off the schedule, and no tick is ever doubled.
- ``every_ms``: every ``every_ms`` since ``start`` (or since the Unix epoch without one,
  so that every 5 minutes is at :00, :05 ... UTC whenever the schedule was made, and a
  new leader computes the very same ticks).
- ``at``: one tick.

Ticks before ``start`` or after ``end`` (both inclusive bounds) never fire.

Cron expressions are parsed and matched by cronsim (PyPI ``cronsim``), not croniter.
Compared in 2026: cronsim is small (one module), typed, has no dependencies, follows
Debian cron's field semantics, is maintained by Healthchecks.io's author (2.8, November
2026) and was 5x faster per next time here (~20-90 us against 260-480 us). croniter was
declared abandoned by its maintainer in early 2025 ("DO NOT USE" on PyPI), was taken
over by the pallets-eco group later that year and is maintained again (7.0.0), but it
needs python-dateutil, and its own time-zone handling fired a daily 02:30 job in
Europe/Berlin twice on the day clocks go back (26 October 2026) in our comparison.
We use neither library's time-zone handling: cronsim walks naive wall-clock times and
this module maps each to an instant by the rules above (``wall_to_instant``), so the
daylight-saving promise is ours and tested here (``tests/storage/test_schedule_times.py``).
Time zones are ``zoneinfo``'s, from the system's database or the ``tzdata`` package.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from dq.storage.codec import MAX_DEADLINE
from dq.storage.errors import InvalidSchedule

__all__ = [
    "MIN_EVERY_MS",
    "Timing",
    "make_timing",
    "next_after",
    "parse_time",
    "ticks_between",
    "upcoming",
    "wall_to_instant",
    "zone",
]

#: the shortest ``every_ms`` a server takes unless its settings allow less
MIN_EVERY_MS = 1000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
#: wall-clock candidates looked at for one tick at most (a per-second cron in the
#: repeated hour skips 3,600 of them): past this a tick is taken as never coming
_MAX_CANDIDATES = 20_000
_OFFSET = re.compile(r"(Z|[+-]\d\d:?\d\d)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Timing:
    """What decides a schedule's ticks; exactly one of ``cron``, ``every_ms``, ``at``."""

    cron: str | None = None
    every_ms: int | None = None
    at: int | None = None
    timezone: str = "UTC"
    start: int | None = None
    end: int | None = None

    @property
    def kind(self) -> str:
        return "cron" if self.cron is not None else "every" if self.every_ms is not None else "at"


@functools.lru_cache(maxsize=512)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name``, or ``InvalidSchedule`` naming it."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise InvalidSchedule(f"unknown time zone {name!r}", field="timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidSchedule(
            f"unknown time zone {name!r}: give an IANA name such as 'Europe/Berlin' or 'UTC'",
            field="timezone",
        ) from None


def to_ms(dt: datetime) -> int:
    return (dt - _EPOCH) // _MS


def from_ms(ms: int, tz: ZoneInfo) -> datetime:
    return (_EPOCH + timedelta(milliseconds=ms)).astimezone(tz)


def parse_time(value: object, tz_name: str, field: str) -> int:
    """An instant given as ms since the epoch or as ISO 8601 text; text without an
    offset is a wall-clock time of ``tz_name`` (mapped by the daylight-saving rules)."""
    if isinstance(value, bool):
        raise InvalidSchedule(f"{field} must be ISO 8601 text or ms since the epoch", field=field)
    if isinstance(value, int):
        ms = value
    elif isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise InvalidSchedule(
                f"{field} {value!r} is not an ISO 8601 time (e.g. '2026-12-01T09:00:00Z')",
                field=field,
            ) from None
        ms = wall_to_instant(parsed, zone(tz_name)) if parsed.tzinfo is None else to_ms(parsed)
    else:
        raise InvalidSchedule(f"{field} must be ISO 8601 text or ms since the epoch", field=field)
    if not 0 <= ms <= MAX_DEADLINE:
        raise InvalidSchedule(f"{field} is outside the times dq can keep", field=field)
    return ms


def wall_to_instant(wall: datetime, tz: ZoneInfo) -> int:
    """The instant of the naive wall-clock time ``wall`` in ``tz``: its first occurrence
    if it happens twice; the first instant after the gap if it does not exist."""
    wall = wall.replace(tzinfo=None)
    first = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return to_ms(first)
    # In a gap, fold=0 reads the wall time with the offset before the jump and fold=1
    # with the one after: the jump lies between the two. Find its first millisecond.
    a = to_ms(wall.replace(tzinfo=tz, fold=1).astimezone(UTC))
    b = to_ms(first)
    lo, hi = min(a, b), max(a, b)
    while lo < hi:
        mid = (lo + hi) // 2
        if from_ms(mid, tz).replace(tzinfo=None) > wall:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _wall(ms: int, tz: ZoneInfo) -> datetime:
    """The naive wall-clock time of ``ms``, to the second (cronsim's resolution)."""
    return from_ms(ms, tz).replace(tzinfo=None, microsecond=0, fold=0)


def _check_cron(expr: object) -> str:
    if not isinstance(expr, str) or not expr.strip():
        raise InvalidSchedule("cron must be a cron expression (5 or 6 fields)", field="cron")
    fields = expr.split()
    if len(fields) not in (5, 6):
        raise InvalidSchedule(
            f"cron {expr!r} has {len(fields)} fields: give 5 (minute hour day month weekday)"
            " or 6 (the seconds first)",
            field="cron",
        )
    try:
        CronSim(expr, datetime(2000, 1, 1))
    except CronSimError as exc:
        raise InvalidSchedule(f"cron {expr!r}: {exc}", field="cron") from None
    return " ".join(fields)


@functools.lru_cache(maxsize=8192)
def _cron_next(expr: str, tz_name: str, after: int) -> int | None:
    """The first instant > ``after`` whose wall time in ``tz_name`` matches ``expr``."""
    tz = zone(tz_name)
    it = CronSim(expr, _wall(after, tz))  # yields wall times strictly after
    for _ in range(_MAX_CANDIDATES):
        try:
            candidate = next(it)
        except StopIteration:  # nothing in the next 50 years
            return None
        ms = wall_to_instant(candidate, tz)
        if ms > after:
            return ms
    return None


def _cron_prev(expr: str, tz_name: str, upto: int) -> int | None:
    """The last instant <= ``upto`` whose wall time matches ``expr``."""
    tz = zone(tz_name)
    local = from_ms(upto, tz)
    # In the repeated hour's second pass, wall times up to the end of the repeated hour
    # map (first occurrence) to instants before ``upto``: start from there.
    start = local.replace(fold=0).replace(tzinfo=None) + (
        local.replace(fold=0).utcoffset() - local.utcoffset()  # type: ignore[operator]
    )
    it = CronSim(expr, start.replace(microsecond=0) + timedelta(seconds=1), reverse=True)
    for _ in range(_MAX_CANDIDATES):
        try:
            candidate = next(it)
        except StopIteration:
            return None
        ms = wall_to_instant(candidate, tz)
        if ms <= upto:
            return ms
    return None


def _every_next(every: int, phase: int, after: int) -> int:
    return phase + ((after - phase) // every + 1) * every


def next_after(t: Timing, after: int) -> int | None:
    """The first tick > ``after`` (None: the schedule fires no more)."""
    if t.start is not None and after < t.start - 1:
        after = t.start - 1
    if t.cron is not None:
        tick = _cron_next(t.cron, t.timezone, after)
    elif t.every_ms is not None:
        tick = _every_next(t.every_ms, t.start or 0, after)
    else:
        assert t.at is not None
        tick = t.at if t.at > after else None
    if tick is None or (t.end is not None and tick > t.end) or tick > MAX_DEADLINE:
        return None
    return tick


def _prev_upto(t: Timing, upto: int) -> int | None:
    """The last tick <= ``upto`` (ignoring ``start``)."""
    if t.end is not None and upto > t.end:
        upto = t.end
    if t.cron is not None:
        return _cron_prev(t.cron, t.timezone, upto)
    if t.every_ms is not None:
        phase = t.start or 0
        if upto < phase:
            return None
        return phase + (upto - phase) // t.every_ms * t.every_ms
    assert t.at is not None
    return t.at if t.at <= upto else None


def ticks_between(t: Timing, after: int, upto: int, limit: int) -> tuple[list[int], int]:
    """The ticks in (``after``, ``upto``], oldest first; at most the newest ``limit``
    of them. Also how many older ones were left out (an interval schedule's exactly; a
    cron's counted up to ``limit``, each costing a search back)."""
    if t.start is not None and after < t.start - 1:
        after = t.start - 1
    if upto <= after or limit <= 0:
        return [], 0
    if t.every_ms is not None:
        end = upto if t.end is None else min(upto, t.end)
        first = _every_next(t.every_ms, t.start or 0, after)
        if first > end:
            return [], 0
        last = (t.start or 0) + (end - (t.start or 0)) // t.every_ms * t.every_ms
        count = (last - first) // t.every_ms + 1
        skipped = max(0, count - limit)
        first += skipped * t.every_ms
        return list(range(first, last + 1, t.every_ms)), skipped
    newest: list[int] = []
    cursor: int | None = upto
    while cursor is not None and cursor > after and len(newest) < limit:
        tick = _prev_upto(t, cursor)
        if tick is None or tick <= after:
            break
        newest.append(tick)
        cursor = tick - 1
    newest.reverse()
    skipped = 0
    if len(newest) == limit:
        probe: int | None = newest[0] - 1
        while probe is not None and skipped < limit:
            tick = _prev_upto(t, probe)
            if tick is None or tick <= after:
                break
            skipped += 1
            probe = tick - 1
    return newest, skipped


def upcoming(t: Timing, after: int, n: int) -> list[int]:
    """The next ``n`` ticks after ``after`` (fewer if the schedule ends)."""
    out: list[int] = []
    tick = next_after(t, after)
    while tick is not None and len(out) < n:
        out.append(tick)
        tick = next_after(t, tick)
    return out


def make_timing(
    *,
    cron: object = None,
    every_ms: object = None,
    at: object = None,
    timezone: object = "UTC",
    start: object = None,
    end: object = None,
    now: int,
    min_every_ms: int = MIN_EVERY_MS,
) -> Timing:
    """Validate a definition's timing; ``InvalidSchedule`` names what is wrong. A timing
    that would never fire from ``now`` on is refused too."""
    given = [n for n, v in (("cron", cron), ("every_ms", every_ms), ("at", at)) if v is not None]
    if len(given) != 1:
        raise InvalidSchedule(
            "give exactly one of cron, every_ms and at"
            + (f" (got {', '.join(given)})" if given else ""),
            field="cron",
        )
    tz_name = "UTC" if timezone is None else timezone
    if not isinstance(tz_name, str):
        raise InvalidSchedule("timezone must be an IANA zone name", field="timezone")
    zone(tz_name)
    lo = None if start is None else parse_time(start, tz_name, "start")
    hi = None if end is None else parse_time(end, tz_name, "end")
    if lo is not None and hi is not None and hi < lo:
        raise InvalidSchedule("end is before start", field="end")
    if cron is not None:
        timing = Timing(cron=_check_cron(cron), timezone=tz_name, start=lo, end=hi)
    elif every_ms is not None:
        if isinstance(every_ms, bool) or not isinstance(every_ms, int):
            raise InvalidSchedule("every_ms must be an integer (milliseconds)", field="every_ms")
        if every_ms < min_every_ms:
            raise InvalidSchedule(
                f"every_ms is {every_ms}: this server fires at most every {min_every_ms} ms "
                "(its schedule_min_every_ms setting)",
                field="every_ms",
            )
        if every_ms > MAX_DEADLINE:
            raise InvalidSchedule("every_ms is longer than dq can keep", field="every_ms")
        timing = Timing(every_ms=every_ms, timezone=tz_name, start=lo, end=hi)
    else:
        timing = Timing(at=parse_time(at, tz_name, "at"), timezone=tz_name, start=lo, end=hi)
    if next_after(timing, now) is None:
        what = {"cron": "cron", "every": "every_ms", "at": "at"}[timing.kind]
        why = (
            "its time has passed"
            if timing.kind == "at"
            else "end has passed"
            if hi is not None and hi < now
            else "no time matches it in the next 50 years"
        )
        raise InvalidSchedule(f"this schedule would never fire: {why}", field=what)
    return timing
