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
in online (``FileJobs._install_merge``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = ["MergePolicy", "MergeSource", "SegmentDesc"]

log = logging.getLogger(__name__)

#: what one tombstone costs in a compressed block (measured: 3-5 bytes)
TOMBSTONE_BYTES = 4


@dataclass(frozen=True, slots=True)
class SegmentDesc:
    """What the policy knows of one segment file: its footer counts and its size."""

    seg_lo: int
    seg_hi: int
    pending: int
    tombstones: int
    size: int


class MergeSource(Protocol):
    """What the policy needs from a queue."""

    name: str

    def segment_descriptions(self) -> list[SegmentDesc]: ...

    def unfrozen_logs(self) -> list[int]: ...

    def merge_idle(self) -> bool: ...

    def merge(self, start: int, stop: int, *, wait: bool = True) -> object: ...


class MergePolicy:
    def __init__(
        self, *, max_segments: int = 256, fan_in: int = 8, garbage_ratio: float = 1.0
    ) -> None:
        self.max_segments = max_segments
        self.fan_in = fan_in
        self.garbage_ratio = garbage_ratio

    def plan(self, q: MergeSource) -> tuple[int, int] | None:
        """The segment range ``[start, stop)`` to merge now, or None."""
        return self.plan_for(q.segment_descriptions(), q.unfrozen_logs())

    def plan_for(
        self, segments: Sequence[SegmentDesc], unfrozen: Sequence[int] = ()
    ) -> tuple[int, int] | None:
        """The range to merge among ``segments`` (sorted by log number).

        Only segments older than every log still waiting for its segment file
        (``unfrozen``) take part: a merge output is named by the range of logs it
        covers, and must never claim one whose entries it does not hold.
        """
        limit = min(unfrozen, default=None)
        segs = [s for s in segments if limit is None or s.seg_hi < limit]
        if not segs:
            return None
        pend = sum(s.pending for s in segs)
        tombs = sum(s.tombstones for s in segs)
        total = sum(s.size for s in segs)
        if tombs:
            pend_bytes = max(total - TOMBSTONE_BYTES * tombs, 0) / pend if pend else 0.0
            pairs = min(tombs, pend)
            garbage = pairs * (pend_bytes + TOMBSTONE_BYTES) + (tombs - pairs) * TOMBSTONE_BYTES
            live = max(total - garbage, 0.0)
            if garbage >= self.garbage_ratio * live:
                return 0, len(segs)
        n = self.fan_in
        if len(segs) > self.max_segments and len(segs) >= n:
            sizes = [s.size for s in segs]
            best = min(range(len(segs) - n + 1), key=lambda i: sum(sizes[i : i + n]))
            return best, best + n
        return None

    def consider(self, q: MergeSource) -> None:
        """Start the planned merge, if any, unless one is already running."""
        if not q.merge_idle():
            return
        planned = self.plan(q)
        if planned is not None:
            log.info("queue %s: merging segments %d..%d", q.name, planned[0], planned[1] - 1)
            try:
                q.merge(planned[0], planned[1], wait=False)
            except Exception as exc:  # raced with another merge or a failure: next time
                log.info("queue %s: merge not started: %s", q.name, exc)
