"""Checks of what a caller asks for, before anything is written: deadlines and leases.

Invariant: every deadline that reaches a key fits its 48 bits (``MAX_DEADLINE``), and
every lease lasts between 1 ms and ``MAX_LEASE_MS``.
"""

from __future__ import annotations

from dq.storage.codec import MAX_DEADLINE
from dq.storage.errors import InvalidArgument, InvalidDeadline

__all__ = ["MAX_LEASE_MS", "check_lease_ms", "resolve_deadline"]


def resolve_deadline(deadline: int | None, delay_ms: int | None, now: int) -> int:
    """The absolute deadline for a write; validates the 48-bit range."""
    if deadline is not None and delay_ms is not None:
        raise InvalidArgument("give either deadline or delay_ms, not both")
    if deadline is None:
        if delay_ms is not None and (not isinstance(delay_ms, int) or delay_ms < 0):
            raise InvalidArgument("delay_ms must be a non-negative integer", delay_ms=delay_ms)
        deadline = now + (delay_ms or 0)
    if (
        not isinstance(deadline, int)
        or isinstance(deadline, bool)
        or not 0 <= deadline <= MAX_DEADLINE
    ):
        if delay_ms is not None:  # the caller gave no deadline: say what they gave
            raise InvalidDeadline(
                f"delay_ms puts the deadline past the last one a key holds ({MAX_DEADLINE} "
                "ms since the epoch, 48 bits)",
                delay_ms=delay_ms,
            )
        raise InvalidDeadline(
            "deadline must be ms since the epoch within 48 bits", deadline=deadline
        )
    return deadline


MAX_LEASE_MS = 12 * 3600 * 1000


def check_lease_ms(lease_ms: int) -> None:
    if (
        not isinstance(lease_ms, int)
        or isinstance(lease_ms, bool)
        or not 1 <= lease_ms <= MAX_LEASE_MS
    ):
        raise InvalidArgument(f"lease_ms must be between 1 and {MAX_LEASE_MS}", lease_ms=lease_ms)
