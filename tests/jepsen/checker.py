"""The checker: what a replicated dq must never do, judged from a run's history alone.

Checks (each failure names the values, ids and times involved):
  - ``lost``: an enqueue answered ok whose value was never delivered (after the drain).
  - ``phantom``: a delivered value that no enqueue ever sent; ``refused_delivered``: a
    delivered value whose enqueue was refused (the server said nothing was written).
  - ``id_reused``: one id carried two different values (acks and deliveries together);
    ``id_changed``: a value acknowledged or delivered under two ids (a keyed enqueue
    repeated with its key must be answered with the first item's id, across failovers).
  - ``id_order``: ids must strictly increase across epochs: an enqueue acknowledged
    before another was sent has the smaller id.
  - ``early``: an item handed out before its deadline (its answer arrived before it).
  - ``released_redelivered``: an item delivered again after a release of it was
    acknowledged, with no leader change in between. After a leader change it is allowed
    (counted in the summary): the documented failover redelivery.
  - ``lease_overlap``: an item handed out again while an earlier delivery's lease still
    held, with no leader change in between (leases live in the leader's memory, so a
    failover may hand a leased item out again).

"A leader change in between" means an ``epoch`` event within the operations' window
widened by ``slack_ms`` each side: the monitor sees a new epoch only when it next
polls, so the window is generous rather than strict.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.jepsen.history import Event

__all__ = ["CHECKS", "Report", "check"]

CHECKS = (
    "lost",
    "phantom",
    "refused_delivered",
    "id_reused",
    "id_changed",
    "id_order",
    "early",
    "released_redelivered",
    "lease_overlap",
)

_SHOWN = 10  # examples printed per check


@dataclass
class Report:
    failures: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not any(self.failures.values())

    def fail(self, check: str, message: str) -> None:
        assert check in CHECKS, check
        self.failures[check].append(message)

    def describe(self) -> str:
        lines = [f"summary: {self.summary}"]
        for name in CHECKS:
            found = self.failures.get(name) or []
            if found:
                lines.append(f"{name}: {len(found)}")
                lines.extend(f"  {m}" for m in found[:_SHOWN])
                if len(found) > _SHOWN:
                    lines.append(f"  ... {len(found) - _SHOWN} more")
        return "\n".join(lines)


class _LeaderChanges:
    """Times at which the monitor saw a new (higher) epoch, the first one excluded (the
    initial election changes no leader)."""

    def __init__(self, events: Iterable[Event], slack_ms: int) -> None:
        self.slack_ms = slack_ms
        times: list[int] = []
        highest: int | None = None
        for e in sorted(events, key=lambda e: e["t"]):
            if highest is not None and e["epoch"] > highest:
                times.append(e["t"])
            if highest is None or e["epoch"] > highest:
                highest = e["epoch"]
        self.times = times

    def between(self, start: int, end: int) -> bool:
        i = bisect.bisect_left(self.times, start - self.slack_ms)
        return i < len(self.times) and self.times[i] <= end + self.slack_ms


def check(events: Iterable[Event], *, slack_ms: int = 2000) -> Report:
    """Judge a whole history (every check above); ``Report.ok`` when none failed."""
    by_type: dict[str, list[Event]] = defaultdict(list)
    for e in events:
        by_type[e["type"]].append(e)
    enqueues, deliveries = by_type["enqueue"], by_type["deliver"]
    releases = by_type["release"]
    changes = _LeaderChanges(by_type["epoch"], slack_ms)
    report = Report()
    _check_sets(report, enqueues, deliveries)
    _check_ids(report, enqueues, deliveries)
    _check_order(report, enqueues)
    _check_early(report, enqueues, deliveries)
    _check_redelivery(report, deliveries, releases, changes)
    outcomes = defaultdict(int)
    for e in enqueues:
        outcomes[e["outcome"]] += 1
    released = defaultdict(int)
    for r in releases:
        released[r["outcome"]] += 1
    report.summary.update(
        enqueue=dict(sorted(outcomes.items())),
        delivered=len(deliveries),
        distinct_delivered=len({d["value"] for d in deliveries}),
        release=dict(sorted(released.items())),
        leader_changes=len(changes.times),
        faults=sorted({n["fault"] for n in by_type["nemesis"] if n.get("phase") == "start"}),
    )
    return report


def _check_sets(report: Report, enqueues: list[Event], deliveries: list[Event]) -> None:
    """A value may be sent more than once (a keyed enqueue retried with its key): it
    must be delivered if any attempt was acknowledged, and not if every one was refused."""
    delivered = {d["value"] for d in deliveries}
    outcomes: dict[str, set[str]] = defaultdict(set)
    first_ok: dict[str, Event] = {}
    for e in enqueues:
        outcomes[e["value"]].add(e["outcome"])
        if e["outcome"] == "ok":
            first_ok.setdefault(e["value"], e)
    for value, e in first_ok.items():
        if value not in delivered:
            report.fail(
                "lost", f"{value!r} id {e['id']} acknowledged at {e['complete']}, never delivered"
            )
    for value in sorted(delivered):
        if value not in outcomes:
            report.fail("phantom", f"{value!r} delivered, never enqueued")
        elif outcomes[value] == {"fail"}:
            report.fail("refused_delivered", f"{value!r} delivered, its enqueue was refused")


def _check_ids(report: Report, enqueues: list[Event], deliveries: list[Event]) -> None:
    values_of: dict[int, set[str]] = defaultdict(set)
    ids_of: dict[str, set[int]] = defaultdict(set)
    acked_ids: dict[str, set[int]] = defaultdict(set)
    for e in enqueues:
        if e["outcome"] == "ok":
            values_of[e["id"]].add(e["value"])
            acked_ids[e["value"]].add(e["id"])
    for d in deliveries:
        values_of[d["id"]].add(d["value"])
        ids_of[d["value"]].add(d["id"])
    for item_id, values in sorted(values_of.items()):
        if len(values) > 1:
            report.fail("id_reused", f"id {item_id} carried {sorted(values)!r}")
    for value in sorted(set(ids_of) | set(acked_ids)):
        acked, got = acked_ids.get(value, set()), ids_of.get(value, set())
        if len(acked | got) > 1:
            report.fail(
                "id_changed",
                f"{value!r} acknowledged as {sorted(acked)}, delivered as {sorted(got)}",
            )


def _check_order(report: Report, enqueues: list[Event]) -> None:
    """Sweep: for each ok enqueue B (by invoke time), the largest id among ok enqueues
    completed strictly before B was sent must be below B's id. A keyed repeat answered
    with the first item's id (``duplicate``) is no new id and is left out."""
    oks = [e for e in enqueues if e["outcome"] == "ok" and not e.get("duplicate")]
    by_complete = sorted(oks, key=lambda e: e["complete"])
    i, best = 0, None
    for b in sorted(oks, key=lambda e: e["invoke"]):
        while i < len(by_complete) and by_complete[i]["complete"] < b["invoke"]:
            if best is None or by_complete[i]["id"] > best["id"]:
                best = by_complete[i]
            i += 1
        if best is not None and best["id"] >= b["id"]:
            report.fail(
                "id_order",
                f"{b['value']!r} got id {b['id']} (sent at {b['invoke']}) after "
                f"{best['value']!r} got id {best['id']} (acknowledged at {best['complete']})",
            )


def _check_early(report: Report, enqueues: list[Event], deliveries: list[Event]) -> None:
    acked_deadline = {e["id"]: e["deadline"] for e in enqueues if e["outcome"] == "ok"}
    for d in deliveries:
        due = max(d["deadline"], acked_deadline.get(d["id"], d["deadline"]))
        if d["complete"] < due:
            report.fail(
                "early",
                f"{d['value']!r} id {d['id']} handed out by {d['complete']}, due at {due}",
            )


def _check_redelivery(
    report: Report, deliveries: list[Event], releases: list[Event], changes: _LeaderChanges
) -> None:
    per_id: dict[int, list[Event]] = defaultdict(list)
    for d in deliveries:
        per_id[d["id"]].append(d)
    failover_redeliveries = 0
    for item_id, ds in per_id.items():
        ds.sort(key=lambda d: d["invoke"])
        for a, b in itertools.pairwise(ds):
            if b["invoke"] > a["complete"] and b["complete"] < a["lease_expires"]:
                if changes.between(a["invoke"], b["complete"]):
                    continue
                report.fail(
                    "lease_overlap",
                    f"id {item_id} handed out by {b['complete']} while the lease of its "
                    f"delivery at {a['complete']} held until {a['lease_expires']}",
                )
    for r in releases:
        if r["outcome"] != "ok":
            continue
        for d in per_id.get(r["id"], ()):
            if d["invoke"] <= r["complete"]:
                continue
            if changes.between(r["invoke"], d["complete"]):
                failover_redeliveries += 1
                continue
            report.fail(
                "released_redelivered",
                f"id {r['id']} released (acknowledged at {r['complete']}), "
                f"delivered again by {d['complete']}",
            )
    report.summary["released_redelivered_after_failover"] = failover_redeliveries
