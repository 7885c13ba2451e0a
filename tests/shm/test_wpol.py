"""Exhaustive interleavings of the WPOL submission-ring protocols (shm/model/wpol.py).

The original design's push/pop must fail (its unsafe windows lose entries or wedge the ring), our
fixed protocol must pass every interleaving, and so must the free list once its head
carries an ABA tag. docs/shm.md ("Submission ring: protocol fixes") explains each case.
"""

from __future__ import annotations

import pytest

from dq.shm.model.wpol import explore_free_list, explore_ring


def test_original_push_and_pop_lose_an_entry() -> None:
    # push: entry CAS then blind tail increment; a stale producer lands a lap ahead.
    found = explore_ring("original", "original", cap=2, producers=[[1], [2]], pop_attempts=2)
    assert found.violation is not None
    assert "lost" in found.violation
    assert found.schedule  # the counterexample is a concrete interleaving


def test_fixed_push_with_original_pop_order_is_unsafe() -> None:
    # Clearing the entry after moving the head lets a producer see room but a set entry.
    found = explore_ring("fixed", "original", cap=2, producers=[[1, 3], [2]], pop_attempts=3)
    assert found.violation is not None


def test_fixed_pop_tolerates_the_original_push() -> None:
    # docs/shm.md, fix 1: the loss needs the original design's pop; ours skips the holes it leaves.
    found = explore_ring("original", "fixed", cap=2, producers=[[1], [2]], pop_attempts=3)
    assert found.violation is None, (found.violation, found.schedule)


def test_fixed_protocol_does_not_support_two_consumers() -> None:
    # Documented restriction: the server is the ring's only consumer.
    found = explore_ring("fixed", "fixed", cap=2, producers=[[1], [2]], consumers=2, pop_attempts=1)
    assert found.violation is not None
    assert "duplicated" in found.violation


@pytest.mark.parametrize(
    ("cap", "producers", "attempts"),
    [
        (2, [[1], [2]], 3),
        (2, [[1, 3], [2]], 2),
        (4, [[1], [2]], 3),
    ],
)
def test_fixed_protocol_is_exactly_once(
    cap: int, producers: list[list[int]], attempts: int
) -> None:
    found = explore_ring("fixed", "fixed", cap=cap, producers=producers, pop_attempts=attempts)
    assert found.violation is None, (found.violation, found.schedule)
    assert found.terminals > 100  # the model really branched


def test_fixed_protocol_survives_a_producer_killed_mid_push() -> None:
    found = explore_ring("fixed", "fixed", cap=2, producers=[[1], [2]], pop_attempts=2, dying=1)
    assert found.violation is None, (found.violation, found.schedule)


def test_original_free_list_double_allocates() -> None:
    found = explore_free_list(tagged=False)
    assert found.violation is not None


def test_tagged_free_list_is_safe() -> None:
    found = explore_free_list(tagged=True)
    assert found.violation is None, (found.violation, found.schedule)
    assert found.terminals > 100
