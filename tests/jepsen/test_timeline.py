"""Outages per fault, read from a history."""

from __future__ import annotations

from tests.jepsen.history import Event
from tests.jepsen.timeline import around, outages

T0 = 1_800_000_000_000


def _enq(at: int, took: int, outcome: str = "ok") -> Event:
    return {"type": "enqueue", "value": f"v{at}", "invoke": T0 + at, "complete": T0 + at + took, "outcome": outcome, "id": at, "deadline": T0}  # fmt: skip


def _fault(name: str, phase: str, at: int) -> Event:
    return {"type": "nemesis", "fault": name, "phase": phase, "t": T0 + at, "detail": ""}


def test_outage_is_time_to_the_first_write_sent_after_the_fault_and_acknowledged() -> None:
    events = [
        _enq(0, 10),
        _fault("kill_leader", "start", 100),
        _enq(90, 5000),  # sent before the fault: does not count
        _enq(150, 3000, "unknown"),
        _enq(3200, 400),
        _enq(3300, 100),  # acknowledged first: 3400 - 100
        _fault("kill_leader", "healed", 2100),
        _fault("pause_leader", "start", 9000),
        _fault("pause_leader", "healed", 14000),
    ]
    kill, pause = outages(events)
    assert kill == {"fault": "kill_leader", "detail": "", "t": T0 + 100, "healed_after_s": 2.0, "writes_after_s": 3.3, "acked_during": 0}  # fmt: skip
    assert pause["writes_after_s"] is None and pause["healed_after_s"] == 5.0
    assert [e["invoke"] - T0 for e in around(events, T0 + 3250, 100)] == [3200, 3300]


def test_writes_acknowledged_during_a_fault_are_counted() -> None:
    events = [
        _fault("stall_leader", "start", 0),
        _enq(-50, 100),  # sent before, acknowledged during: counted
        _enq(5000, 100),
        _enq(9000, 100),
        _fault("stall_leader", "healed", 12000),
        _enq(12500, 100),  # after the heal
    ]
    [stall] = outages(events)
    assert stall["acked_during"] == 3 and stall["writes_after_s"] == 5.1
