"""How the ``dq`` commands write counts for people.

Invariant: only human output goes through here; ``--json`` prints the values as the
API gives them, so scripts never parse these words.
"""

from __future__ import annotations

__all__ = ["plural"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 item``, ``2 items``, ``0 items``: a count with its noun agreeing."""
    return f"{n} {word if n == 1 else (many or word + 's')}"
