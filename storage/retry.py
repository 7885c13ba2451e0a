"""A queue's retry policy: how long a failed item waits before its next delivery.

A retry in dq is a new deadline, so the policy lives in the server, beside the item,
instead of in every consumer: when a consumer fails an item (``POST .../fail``) or its
lease runs out, the item's next deadline is now + ``delay_ms(n)``, where ``n`` is the
delivery that failed (1 for the first). Two shapes, as the queue's config ``retry``:

- exponential: ``{"initial_ms": 1000, "multiplier": 2, "max_ms": 3600000, "jitter": 0.1}``
  — delay(n) = min(max_ms, initial_ms x multiplier^(n-1)), then made up to ``jitter``
  shorter at random (0.1: between 90 % and 100 % of it), so that items that failed
  together do not all come back in the same millisecond;
- a list: ``{"delays_ms": [1000, 10000, 60000]}`` — delay(n) = the n-th delay, the last
  one repeating.

A queue without ``retry`` keeps what dq always did: an expired lease, or a failed
item, is due again at once. Every bound here is checked when the config is put, so a
queue never holds a policy it cannot apply.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dq.storage.errors import OutOfRange

__all__ = ["MAX_DELAYS", "MAX_RETRY_DELAY_MS", "RetryPolicy", "retry_from_json"]

#: the longest delay a policy may give: a year (a key's deadline holds 48 bits of ms,
#: so a delay stays far inside it for millennia)
MAX_RETRY_DELAY_MS = 366 * 24 * 3600 * 1000
#: the most delays a list may give
MAX_DELAYS = 100

_EXPONENTIAL = ("initial_ms", "multiplier", "max_ms", "jitter")


def _ms(name: str, value: object) -> int:
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not (0 <= value <= MAX_RETRY_DELAY_MS)
    ):
        raise OutOfRange(
            f"retry.{name} must be a whole number of ms between 0 and {MAX_RETRY_DELAY_MS}",
            f"retry.{name}",
        )
    return value


def _number(name: str, value: object, low: float, high: float) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or not low <= value <= high
    ):
        raise OutOfRange(
            f"retry.{name} must be a number between {low:g} and {high:g}", f"retry.{name}"
        )
    return float(value)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential (``initial_ms`` set) or a list of delays (``delays_ms`` set)."""

    initial_ms: int | None = None
    multiplier: float = 2.0
    max_ms: int = 3_600_000
    jitter: float = 0.0
    delays_ms: tuple[int, ...] | None = None

    def delay_ms(self, delivery: int, rand: Callable[[], float] = random.random) -> int:
        """How long item waits after its ``delivery``-th delivery failed (1: the first)."""
        n = max(1, delivery)
        if self.delays_ms is not None:
            return self.delays_ms[min(n, len(self.delays_ms)) - 1]
        assert self.initial_ms is not None
        # multiplier^(n-1) overflows a float for a long-failing item: cap the exponent
        # once the delay has reached max_ms anyway
        raw = float(self.initial_ms)
        if self.multiplier > 1 and raw > 0:
            steps = math.log(max(self.max_ms, 1) / raw, self.multiplier) + 1
            raw *= self.multiplier ** min(n - 1, max(0.0, steps))
        delay = min(float(self.max_ms), raw)
        if self.jitter:
            delay *= 1.0 - self.jitter * rand()
        return int(delay)

    def to_json(self) -> dict[str, Any]:
        """The policy as the API and ``queue.json`` show it: only its shape's fields."""
        if self.delays_ms is not None:
            return {"delays_ms": list(self.delays_ms)}
        return {
            "initial_ms": self.initial_ms,
            "multiplier": self.multiplier,
            "max_ms": self.max_ms,
            "jitter": self.jitter,
        }


def retry_from_json(raw: object) -> RetryPolicy | None:
    """A policy from its JSON (None: no policy), or ``OutOfRange`` (422) naming the field."""
    if raw is None:
        return None
    if isinstance(raw, RetryPolicy):
        raw = raw.to_json()
    if not isinstance(raw, Mapping):
        raise OutOfRange(
            'retry must be an object: {"initial_ms", "multiplier", "max_ms", "jitter"} '
            'or {"delays_ms": [...]}',
            "retry",
        )
    unknown = sorted(set(raw) - {*_EXPONENTIAL, "delays_ms"})
    if unknown:
        raise OutOfRange(f"retry has no field {unknown[0]!r}", f"retry.{unknown[0]}")
    if "delays_ms" in raw:
        mixed = [k for k in _EXPONENTIAL if raw.get(k) is not None]
        if mixed:
            raise OutOfRange(
                f"retry takes delays_ms or initial_ms/multiplier/max_ms/jitter, not both "
                f"(got delays_ms and {mixed[0]})",
                "retry",
            )
        delays = raw["delays_ms"]
        if not isinstance(delays, list | tuple) or not 1 <= len(delays) <= MAX_DELAYS:
            raise OutOfRange(
                f"retry.delays_ms must be a list of 1 to {MAX_DELAYS} delays in ms",
                "retry.delays_ms",
            )
        return RetryPolicy(delays_ms=tuple(_ms("delays_ms", d) for d in delays))
    if raw.get("initial_ms") is None:
        raise OutOfRange(
            "retry needs initial_ms (exponential backoff) or delays_ms (a list of delays)",
            "retry.initial_ms",
        )
    initial = _ms("initial_ms", raw["initial_ms"])
    multiplier = _number("multiplier", raw.get("multiplier", 2.0), 1.0, 1000.0)
    max_ms = _ms("max_ms", raw.get("max_ms", max(3_600_000, initial)))
    if max_ms < initial:
        raise OutOfRange(
            f"retry.max_ms ({max_ms}) must be at least initial_ms ({initial})",
            "retry.max_ms",
        )
    jitter = _number("jitter", raw.get("jitter", 0.0), 0.0, 1.0)
    return RetryPolicy(initial, multiplier, max_ms, jitter)
