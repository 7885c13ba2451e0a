"""Argument coercion and outcome checks shared by ``Client`` and ``AsyncClient``."""

from __future__ import annotations

from dq.client.errors import error_for
from dq.client.types import Item, NewItem, Outcome, Release

__all__ = ["as_new_item", "as_release", "check_outcome"]


def as_new_item(
    value: bytes | str | NewItem,
    deadline: int | None = None,
    delay_ms: int | None = None,
    key: str | None = None,
    group: str | None = None,
    on_duplicate: str = "keep",
) -> NewItem:
    if isinstance(value, NewItem):
        return value
    if isinstance(value, str):
        data = value.encode("utf-8")
    elif isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
    else:  # bytes(123) is 123 zero bytes and bytes(True) one: the value would be lost
        raise TypeError(f"a value is bytes or str, not {type(value).__name__}")
    return NewItem(data, deadline, delay_ms, key, group, on_duplicate)


def as_release(item: Item | Release) -> Release:
    return item if isinstance(item, Release) else Release(item.id, item.receipt)


def check_outcome(outcome: Outcome, queue: str) -> Outcome:
    """Return a successful outcome; raise the matching ``ServerError`` for a failed one."""
    if outcome.ok:
        return outcome
    code = outcome.error or "error"
    raise error_for(None, code, outcome.message or code, queue=queue, id=outcome.id)
