"""``ApproximateFirstReceiveTimestamp``: when each message was first received.

dq's item stats hold the enqueue time, the last requeue time and the delivery count,
not the time of the first delivery, so the SQS layer remembers it: in memory, bounded
(the oldest entries go first), forgotten when the message is deleted. After a server
restart, or for a message first received more than ``limit`` receipts ago, the time
is unknown and the attribute is left out rather than made up (docs/sqs.md). A receive
under way at a restart was never counted (the delivery count is written when a lease
ends, not when it starts), so the next receive of such a message is its first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

__all__ = ["FirstReceives"]


class FirstReceives:
    def __init__(self, limit: int = 200_000) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, int], int] = OrderedDict()

    def on_delivery(self, queue: str, item_id: int, count: int, now: int) -> int | None:
        """The first receive time of this delivery's message, if known."""
        key = (queue, item_id)
        with self._lock:
            if count == 1:
                self._seen[key] = now
                if len(self._seen) > self._limit:
                    self._seen.popitem(last=False)
                return now
            return self._seen.get(key)

    def known(self, queue: str, item_id: int) -> int | None:
        """The first receive time remembered for a message (a receive answered again)."""
        with self._lock:
            return self._seen.get((queue, item_id))

    def forget(self, queue: str, ids: list[int]) -> None:
        with self._lock:
            for i in ids:
                self._seen.pop((queue, i), None)

    def forget_queue(self, queue: str) -> None:
        with self._lock:
            for key in [k for k in self._seen if k[0] == queue]:
                del self._seen[key]
