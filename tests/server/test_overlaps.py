"""tests/server/overlaps.py, the count the delivery rules' races are held to: it must
see an overlap where there is one, or those races could not fail."""

from __future__ import annotations

from tests.server.overlaps import most_at_once


def test_the_most_held_at_once_per_group_and_in_all() -> None:
    spans = [(0.0, 2.0, "a"), (1.0, 3.0, "a"), (1.5, 4.0, "b"), (5.0, 6.0, None)]
    assert most_at_once(spans) == ({"a": 2, "b": 1, None: 1}, 3)


def test_an_end_and_a_start_at_one_instant_do_not_overlap() -> None:
    assert most_at_once([(0.0, 1.0, "a"), (1.0, 2.0, "a")]) == ({"a": 1}, 1)
    assert most_at_once([]) == ({}, 0)
