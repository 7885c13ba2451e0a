"""When to merge segment files (placeholder policy replaced in the merging issue)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.queue import Queue

__all__ = ["MergePolicy"]


class MergePolicy:
    def consider(self, q: Queue) -> None:
        return None
