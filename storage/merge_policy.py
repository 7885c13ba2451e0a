"""When to merge segment files, and which ones.

Two triggers (``docs/merging.md``):

1. **Garbage.** Released and requeued items leave pending/tombstone pairs. When the
   estimated bytes those pairs occupy reach the bytes still live, merge *every*
   segment file into one: every pair meets and cancels, and with nothing older left
   outside the merge, rogue tombstones are dropped too. A live byte is rewritten only
   when at least as many dead bytes are reclaimed, so these merges add at most ~1 to
   write amplification however the workload behaves; and a queue that drains to
   empty merges down to nothing.
2. **Count.** When there are more than ``max_segments`` files (256: 4 GiB of 16 MiB
   logs), merge the ``fan_in`` (8) adjacent ones with the fewest bytes (usually small
   tombstone-only files). Such a merge does not start at the oldest segment, so its
   rogue tombstones are kept. The bound is high on purpose: every count merge rewrites
   live bytes, and a merge of a few hundred readers costs dequeue only a log factor.

Merges run one at a time per queue in the compaction worker; the result is swapped
in online (``Queue._install_merge``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.queue import Queue

__all__ = ["MergePolicy"]

log = logging.getLogger(__name__)

#: what one tombstone costs in a compressed block (measured: 3-5 bytes)
TOMBSTONE_BYTES = 4


class MergePolicy:
    def __init__(
        self, *, max_segments: int = 256, fan_in: int = 8, garbage_ratio: float = 1.0
    ) -> None:
        self.max_segments = max_segments
        self.fan_in = fan_in
        self.garbage_ratio = garbage_ratio

    def plan(self, q: Queue) -> tuple[int, int] | None:
        """The segment range ``[start, stop)`` to merge now, or None."""
        segs = q.segments
        if not segs:
            return None
        pend = sum(r.info.pending_count for r in segs)
        tombs = sum(r.info.tombstone_count for r in segs)
        total = sum(r.file_size for r in segs)
        if tombs:
            pend_bytes = max(total - TOMBSTONE_BYTES * tombs, 0) / pend if pend else 0.0
            pairs = min(tombs, pend)
            garbage = pairs * (pend_bytes + TOMBSTONE_BYTES) + (tombs - pairs) * TOMBSTONE_BYTES
            live = max(total - garbage, 0.0)
            if garbage >= self.garbage_ratio * live:
                return 0, len(segs)
        if len(segs) > self.max_segments:
            n = self.fan_in
            sizes = [r.file_size for r in segs]
            best = min(range(len(segs) - n + 1), key=lambda i: sum(sizes[i : i + n]))
            return best, best + n
        return None

    def consider(self, q: Queue) -> None:
        """Start the planned merge, if any, unless one is already running."""
        with q.lock:
            if q.closed or q._merging or q.failed is not None:
                return
            planned = self.plan(q)
        if planned is not None:
            log.info("queue %s: merging segments %d..%d", q.name, planned[0], planned[1] - 1)
            q.merge(planned[0], planned[1], wait=False)
