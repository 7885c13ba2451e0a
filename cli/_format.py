"""How the ``dq`` commands write counts, times and ages for people, and read the times
people write.

Invariant: only human output goes through here; ``--json`` prints the values as the
API gives them (times in ms since the epoch), so scripts never parse these words.
Times are ISO 8601 in the local time zone with its offset, to the millisecond: what the
operator's clock says, and unambiguous when pasted elsewhere.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import datetime

__all__ = ["When", "age", "parse_when", "plural", "when"]

#: A bare integer below this (1973-03-03 as ms) is not a deadline anyone means: it is
#: seconds since the epoch, or a small number meant as a delay.
_LEAST_MS = 100_000_000_000
#: ... and one above this (year 5138 as ms) is microseconds or nanoseconds.
_MOST_MS = 100_000_000_000_000
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_RELATIVE = re.compile(r"([+-])(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 item``, ``2 items``, ``0 items``: a count with its noun agreeing."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def when(ms: int | None) -> str:
    """An epoch-ms time as ISO 8601 local time, ``-`` for none."""
    if ms is None:
        return "-"
    moment = datetime.fromtimestamp(ms / 1000).astimezone()
    return moment.isoformat(timespec="milliseconds")


def age(ms: float | None) -> str:
    """A duration in ms as people say it: ``850 ms``, ``12.3 s``, ``4.0 min``, ``2.5 h``."""
    if ms is None:
        return "-"
    sign, ms = ("-" if ms < 0 else ""), abs(ms)
    if ms < 1000:
        return f"{sign}{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        return f"{sign}{s / 60:.1f} min"
    if s < 48 * 3600:
        return f"{sign}{s / 3600:.1f} h"
    return f"{sign}{s / 86400:.1f} d"


class When:
    """A deadline as given on the command line: an absolute time (ms since the epoch)
    or, for ``+5m``, a delay the server adds to its own clock (a skewed client clock
    does not move it)."""

    __slots__ = ("deadline", "delay_ms")

    def __init__(self, deadline: int | None = None, delay_ms: int | None = None) -> None:
        self.deadline = deadline
        self.delay_ms = delay_ms


def parse_when(text: str) -> When:
    """``--deadline``'s argument: ISO 8601 (no offset: local time), ``now``, a relative
    time (``+90s``, ``+5m``, ``+2h``, ``+1d``, ``-10m``), or ms since the epoch. A bare
    number that is plainly seconds, a delay or 1970 is refused: the server would keep it
    and hand the item out at once, first in line."""
    text = text.strip()
    if text == "now":
        return When(delay_ms=0)
    rel = _RELATIVE.fullmatch(text)
    if rel is not None:
        ms = round(float(rel.group(2)) * _UNITS_MS[rel.group(3)])
        if rel.group(1) == "+":
            return When(delay_ms=ms)
        return When(deadline=int(time.time() * 1000) - ms)
    if re.fullmatch(r"-?\d+", text):
        return When(deadline=_epoch_ms(int(text)))
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a time: give ISO 8601 (2026-12-01T09:30, 2026-12-01T09:30:00Z), "
            "a relative time (+90s, +5m, +2h, +1d) or ms since the epoch"
        ) from None
    return When(deadline=round(moment.astimezone().timestamp() * 1000))


def _epoch_ms(n: int) -> int:
    also = "--deadline also takes ISO 8601 (2026-12-01T09:30) and relative times (+5m)"
    if n < 0:
        raise argparse.ArgumentTypeError(f"{n}: a time is not negative; {also}")
    if n < _LEAST_MS:
        if n >= 100_000_000:  # 1973 and on, in seconds
            raise argparse.ArgumentTypeError(
                f"{n} looks like seconds since the epoch ({when(n * 1000)}); --deadline "
                f"takes milliseconds ({n * 1000}); {also}"
            )
        raise argparse.ArgumentTypeError(
            f"{n} as ms since the epoch is in 1970 ({when(n)}): for {n} seconds from now "
            f"give +{n}s; {also} (write 1970-01-01T00:00:00Z if 1970 is meant)"
        )
    if n >= _MOST_MS:
        raise argparse.ArgumentTypeError(
            f"{n} looks like micro- or nanoseconds since the epoch; --deadline takes "
            f"milliseconds ({n // 1000} or {n // 1_000_000}); {also}"
        )
    return n
