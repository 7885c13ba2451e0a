"""Exhaustive interleaving models of the shared-memory protocols (see docs/shm.md).

``explore`` enumerates every interleaving of a few threads' atomic steps over a small
shared memory; ``wpol`` states the original design's WPOL submission-ring protocol and our fixed one
as threads for it. The tests run both: the original design's version must fail, ours must pass.
"""

from __future__ import annotations

from dq.shm.model.explore import Exploration, Op, explore

__all__ = ["Exploration", "Op", "explore"]
