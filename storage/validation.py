"""The rules of what a caller may ask for, each written once, with its one wording.

Every front end — the HTTP routes and their fast path, the ring, SQS, and the Python
client checking before it sends — refuses a request that breaks one of these rules
with the same words: a field outside its range is ``OutOfRange`` (422
``validation_error``, "lease_ms must be between 1 and 43200000"), a batch over the
server's limit ``BatchTooLarge`` (413). The HTTP request models declare their bounds
from the ``Range`` objects here (``server/schemas.py``), and a bound they refuse is
worded by its ``Range`` (``server/errors.py``); the client imports this module for
its own checks.

Invariant: every deadline that reaches a key fits its 48 bits (``MAX_DEADLINE``), and
every lease lasts between 1 ms and ``MAX_LEASE_MS``; the ranges of a queue's delivery
rules are here too (``queue_config.check_rules`` checks a config against them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dq.storage.codec import MAX_DEADLINE
from dq.storage.errors import BatchTooLarge, BrokenRule, InvalidDeadline, OutOfRange

__all__ = [
    "BURST",
    "DEADLINE",
    "DEFAULT_LEASE_MS",
    "DELAY_MS",
    "GROUP_LIMIT",
    "LEASED_LIMIT",
    "LEASE_MS",
    "MAX_LEASE_MS",
    "NOT_BOTH",
    "PER_SECOND",
    "RANGES",
    "RECEIPT",
    "WAIT_MS",
    "Range",
    "batch_too_large_message",
    "check_batch",
    "check_lease_ms",
    "count_range",
    "resolve_deadline",
]

MAX_LEASE_MS = 12 * 3600 * 1000
#: A receipt is opaque, but no server hands out a longer one.
MAX_RECEIPT = 512


@dataclass(frozen=True, slots=True)
class Range:
    """A field's allowed values, ``low`` to ``high`` inclusive (for text, its length;
    for a ``real`` number, above ``low`` and at most ``high``)."""

    field: str
    low: int
    high: int
    unit: str = ""
    real: bool = False

    @property
    def message(self) -> str:
        if self.real:
            return f"{self.field} must be a number above {self.low} and at most {self.high}"
        return f"{self.field} must be between {self.low} and {self.high}{self.unit}"

    def holds(self, value: object) -> bool:
        if self.unit:
            return isinstance(value, str) and self.low <= len(value) <= self.high
        if self.real:
            return (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and self.low < value <= self.high
            )
        return type(value) is int and self.low <= value <= self.high

    def check(self, value: object) -> None:
        """Raise ``OutOfRange`` unless ``value`` is within the range."""
        if not self.holds(value):
            raise OutOfRange(self.message, self.field)


LEASE_MS = Range("lease_ms", 1, MAX_LEASE_MS)
DEFAULT_LEASE_MS = Range("default_lease_ms", 1, MAX_LEASE_MS)
WAIT_MS = Range("wait_ms", 0, MAX_DEADLINE)
DEADLINE = Range("deadline", 0, MAX_DEADLINE)
DELAY_MS = Range("delay_ms", 0, MAX_DEADLINE)
RECEIPT = Range("receipt", 1, MAX_RECEIPT, " characters")
#: A queue's delivery rules (``docs/delivery.md``); each limit may also be null (none).
MAX_LIMIT = 0xFFFFFFFF
GROUP_LIMIT = Range("group_limit", 1, MAX_LIMIT)
LEASED_LIMIT = Range("leased_limit", 1, MAX_LIMIT)
PER_SECOND = Range("per_second", 0, 1_000_000, real=True)
BURST = Range("burst", 1, MAX_LIMIT)
#: The rules of fields whose range is fixed, by field name.
RANGES = {
    r.field: r
    for r in (
        LEASE_MS,
        DEFAULT_LEASE_MS,
        WAIT_MS,
        DEADLINE,
        DELAY_MS,
        RECEIPT,
        GROUP_LIMIT,
        LEASED_LIMIT,
        PER_SECOND,
        BURST,
    )
}


#: ``deadline`` and ``delay_ms`` are two ways to say when an item is due
NOT_BOTH = "give deadline or delay_ms, not both (delay_ms is relative to now)"


def count_range(limit: int) -> Range:
    """A dequeue's ``count``: the server's batch limit bounds it (``DQ_MAX_BATCH``)."""
    return Range("count", 1, limit)


def batch_too_large_message(limit: int) -> str:
    return f"more than {limit} items in one request; the limit is {limit}"


def check_batch(n: int, limit: int) -> None:
    """A batch (items of an enqueue, a release, a requeue, an extend, or the releases a
    dequeue carries) holds at most ``limit`` items."""
    if n > limit:
        raise BatchTooLarge(batch_too_large_message(limit))  # the rule's words alone


def check_lease_ms(lease_ms: int, rule: Range = LEASE_MS) -> None:
    if type(lease_ms) is not int or not 1 <= lease_ms <= MAX_LEASE_MS:
        rule.check(lease_ms)  # raises, in the rule's words


def resolve_deadline(deadline: int | None, delay_ms: int | None, now: int) -> int:
    """The absolute deadline for a write: the fields' rules, then the 48-bit range of
    the deadline a delay makes."""
    if deadline is not None:
        if delay_ms is not None:
            raise BrokenRule(NOT_BOTH, "delay_ms")
        DEADLINE.check(deadline)
        return deadline
    if delay_ms is None:
        return now
    DELAY_MS.check(delay_ms)
    deadline = now + delay_ms
    if deadline > MAX_DEADLINE:  # the caller gave no deadline: say what they gave
        raise InvalidDeadline(
            f"delay_ms puts the deadline past the last one a key holds ({MAX_DEADLINE} "
            "ms since the epoch, 48 bits)",
            delay_ms=delay_ms,
        )
    return deadline
