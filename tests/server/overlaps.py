"""The most deliveries held at one instant, per group and in all: what the races of the
delivery rules hold ``group_limit`` and ``leased_limit`` to, from when each consumer held
its item (tests/server/test_delivery_races.py on one server,
tests/replication/test_rules_failover.py across a change of leader).

A delivery that ends at the instant another starts does not overlap it: the slot a
release frees may be taken at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import TypeVar

__all__ = ["most_at_once"]

G = TypeVar("G", bound=Hashable)


def most_at_once(spans: Iterable[tuple[float, float, G]]) -> tuple[dict[G, int], int]:
    """From each delivery's (held from, held to, group): the most held at one instant of
    each group, and of all."""
    held = list(spans)
    events = sorted(
        [(a, 1, g) for a, _b, g in held] + [(b, -1, g) for _a, b, g in held],
        key=lambda e: (e[0], e[1]),  # an end before a start at the same instant
    )
    per: dict[G, int] = {}
    top: dict[G, int] = {}
    now = most = 0
    for _t, step, g in events:
        per[g] = per.get(g, 0) + step
        top[g] = max(top.get(g, 0), per[g])
        now += step
        most = max(most, now)
    return top, most
