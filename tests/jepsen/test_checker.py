"""The checker on synthetic histories: good ones pass, and each kind of bad one fails
with the check that names it (and only that one)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.jepsen.checker import check
from tests.jepsen.history import Event, History, load

T0 = 1_800_000_000_000


def enq(
    value: str,
    item_id: int | None,
    at: int,
    *,
    outcome: str = "ok",
    deadline: int | None = None,
    took: int = 5,
) -> Event:
    e: dict[str, Any] = {"type": "enqueue", "value": value, "outcome": outcome}
    e.update(invoke=T0 + at, complete=T0 + at + took)
    if outcome == "ok":
        e.update(id=item_id, deadline=T0 + (deadline if deadline is not None else at))
    return e


def dlv(
    value: str, item_id: int, at: int, *, deadline: int = 0, lease_ms: int = 1000, took: int = 5
) -> Event:
    e: dict[str, Any] = {"type": "deliver", "value": value, "id": item_id}
    e.update(invoke=T0 + at, complete=T0 + at + took, deadline=T0 + deadline)
    e.update(receipt=f"r{item_id}-{at}", lease_expires=T0 + at + lease_ms)
    return e


def rel(item_id: int, at: int, *, outcome: str = "ok", took: int = 5) -> Event:
    e: dict[str, Any] = {"type": "release", "id": item_id, "value": "", "outcome": outcome}
    e.update(invoke=T0 + at, complete=T0 + at + took)
    return e


def epoch(n: int, at: int) -> Event:
    return {"type": "epoch", "t": T0 + at, "epoch": n, "node": "n1"}


def good_history() -> list[Event]:
    return [
        epoch(5, 0),
        enq("a", 1, 10),
        enq("b", 2, 20, deadline=500),
        enq("c", None, 30, outcome="unknown"),  # may or may not be delivered
        enq("d", None, 40, outcome="fail"),
        enq("e", None, 50, outcome="unknown"),
        dlv("a", 1, 100),
        rel(1, 110),
        dlv("e", 7, 120),  # an unknown enqueue that did commit
        dlv("b", 2, 600, deadline=500, lease_ms=300),
        dlv("b", 2, 1000, deadline=500),  # the first lease expired: redelivery is fine
        rel(2, 1010),
    ]


def failed_checks(events: list[Event]) -> set[str]:
    return {name for name, found in check(events).failures.items() if found}


def test_good_history_passes() -> None:
    report = check(good_history())
    assert report.ok, report.describe()
    assert report.summary["enqueue"] == {"fail": 1, "ok": 2, "unknown": 2}
    assert report.summary["leader_changes"] == 0


def test_lost_acknowledged_enqueue_fails() -> None:
    events = [*good_history(), enq("z", 9, 2000)]
    assert failed_checks(events) == {"lost"}
    assert "'z' id 9" in check(events).describe()


def test_phantom_and_refused_deliveries_fail() -> None:
    assert failed_checks([*good_history(), dlv("never", 50, 2000)]) == {"phantom"}
    assert failed_checks([*good_history(), dlv("d", 50, 2000)]) == {"refused_delivered"}


def test_id_reused_for_another_value_fails() -> None:
    events = [*good_history(), enq("x", 1, 3000), dlv("x", 1, 3100)]
    assert "id_reused" in failed_checks(events)


def test_value_delivered_under_another_id_fails() -> None:
    events = [*good_history(), enq("x", 40, 3000), dlv("x", 41, 3100)]
    assert failed_checks(events) == {"id_changed"}


def test_ids_must_grow_across_epochs() -> None:
    # "y" was sent after "x" was acknowledged but got a smaller id: a new leader reused
    # the id space.
    events = [epoch(5, 0), enq("x", 10, 100), epoch(9, 200), enq("y", 8, 300)]
    events += [dlv("x", 10, 400), dlv("y", 8, 410)]
    assert failed_checks(events) == {"id_order"}
    # Concurrent enqueues may be acknowledged in any id order.
    events = [enq("x", 10, 100, took=50), enq("y", 8, 120, took=50)]
    events += [dlv("x", 10, 400), dlv("y", 8, 410)]
    assert failed_checks(events) == set()


def test_delivery_before_deadline_fails() -> None:
    events = [enq("x", 3, 0, deadline=1000), dlv("x", 3, 500, deadline=1000)]
    assert failed_checks(events) == {"early"}
    # The delivered deadline alone is checked too (an item whose ack was lost).
    events = [enq("x", None, 0, outcome="unknown"), dlv("x", 3, 500, deadline=1000)]
    assert failed_checks(events) == {"early"}


def test_released_item_redelivered_without_leader_change_fails() -> None:
    events = [enq("x", 3, 0), dlv("x", 3, 10, lease_ms=200), rel(3, 20), dlv("x", 3, 5000)]
    assert failed_checks(events) == {"released_redelivered"}


def test_released_item_redelivered_after_leader_change_is_allowed() -> None:
    events = [epoch(4, 0), enq("x", 3, 0), dlv("x", 3, 10, lease_ms=200), rel(3, 20)]
    events += [epoch(8, 4000), dlv("x", 3, 9000)]
    report = check(events, slack_ms=1000)
    assert report.ok, report.describe()
    assert report.summary["released_redelivered_after_failover"] == 1
    assert report.summary["leader_changes"] == 1


def test_a_leader_change_outside_the_window_does_not_excuse() -> None:
    # The epoch changed long before the release: the release was acknowledged by the
    # new leader, so redelivering it is a lost release.
    events = [epoch(4, 0), enq("x", 3, 0), dlv("x", 3, 10, lease_ms=200), epoch(6, 30)]
    events += [rel(3, 5000), dlv("x", 3, 9000)]
    assert failed_checks(events) == {"released_redelivered"}


def test_unknown_or_failed_release_may_be_redelivered() -> None:
    for outcome in ("unknown", "fail"):
        events = [enq("x", 3, 0), dlv("x", 3, 10, lease_ms=200), rel(3, 20, outcome=outcome)]
        events.append(dlv("x", 3, 5000))
        assert failed_checks(events) == set(), outcome


def test_second_delivery_within_a_lease_fails_unless_the_leader_changed() -> None:
    events = [enq("x", 3, 0), dlv("x", 3, 10, lease_ms=5000), dlv("x", 3, 1000)]
    assert failed_checks(events) == {"lease_overlap"}
    assert failed_checks([epoch(1, 0), *events, epoch(2, 500)]) == set()


def test_history_file_round_trip_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path)
    for e in good_history():
        history.add(e)
    history.close()
    with path.open("a") as f:
        f.write('{"type": "deliver", "val')  # the run died mid-line
    loaded = load(path)
    assert loaded == good_history()
    assert check(loaded).ok


@pytest.mark.parametrize("slack", [0, 2000])
def test_report_describes_every_failed_check(slack: int) -> None:
    events = [enq("z", 9, 2000), dlv("never", 50, 2000)]
    text = check(events, slack_ms=slack).describe()
    assert "lost: 1" in text and "phantom: 1" in text


def test_keyed_repeats_share_one_id() -> None:
    # The first attempt's answer was lost; the repeat with the same key is answered with
    # the first item's id (smaller than ids acknowledged meanwhile: not an order failure).
    first = enq("k", None, 0, outcome="unknown")
    other = enq("o", 6, 100)
    repeat = {**enq("k", 5, 200), "duplicate": True}
    events = [first, other, repeat, dlv("k", 5, 300), dlv("o", 6, 310)]
    assert failed_checks(events) == set()
    # The repeat made a second item: the key was forgotten (a failover lost it).
    events = [first, other, enq("k", 9, 200), dlv("k", 5, 300), dlv("k", 9, 310), dlv("o", 6, 320)]
    assert failed_checks(events) == {"id_changed"}
    events = [enq("k", 5, 0), enq("k", 9, 200), dlv("k", 5, 300), dlv("k", 9, 310)]
    assert failed_checks(events) == {"id_changed"}


def test_a_value_sent_several_times_is_judged_on_every_attempt() -> None:
    refused, ok = enq("k", None, 0, outcome="fail"), enq("k", 5, 100)
    assert failed_checks([refused, ok]) == {"lost"}
    assert failed_checks([refused, ok, dlv("k", 5, 300)]) == set()
    again = enq("k", None, 100, outcome="fail")
    assert failed_checks([refused, again, dlv("k", 5, 300)]) == {"refused_delivered"}
    maybe = enq("k", None, 100, outcome="unknown")
    assert failed_checks([refused, maybe, dlv("k", 5, 300)]) == set()
