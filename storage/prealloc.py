"""How far ahead of its records a log is allocated: the step, and when it grows.

A log is allocated ahead of its records (``fileio.allocate``, ``posix_fallocate``) so
that the ``fdatasync`` of a durable round seldom has a file size to record. On ext4 a
sync into allocated but unwritten space still waits now and then for the extent tree
(blocks turning written), and a short probe counted fewer such waits the larger the
allocated extent: 0.42 per sync in 64 KiB steps, 0.15 in 1 MiB steps (``bench/NOTES.md``,
"A durable single request over HTTP, counted in the kernel"; longer counts since put the
difference within the spread between runs: "The log's allocation step adapts"). A large
step costs disk space, though: an open log holds up to one step of zeros beyond its
records, and an engine may hold thousands of queues that are written seldom.

So the step adapts to how fast the log uses it up, as XFS's speculative preallocation
past the end of a file grows with the file and is given back when it is closed. The rule
(``docs/storage.md``, "Durability"), kept here alone:

- the first allocation of a log is one step of ``base`` bytes (``wal_prealloc_bytes``);
- a log that reaches its allocated end within ``HOT_SECONDS`` of its last allocation
  doubles its step, up to ``cap`` (``wal_prealloc_max_bytes``);
- one that took longer than ``COLD_SECONDS`` goes back to ``base``; in between the step
  stays as it is (so a steady writer does not saw between two sizes);
- each allocation runs to the next multiple of the step past the write's end, so a log
  holds less than one step (at most ``cap`` bytes) beyond its records while it is open.

Closing the log gives the tail back (``WalWriter.close``); a new log starts at ``base``.
This object only decides sizes: it does no I/O, and its clock is the module's
``monotonic`` (a test may replace it).
"""

from __future__ import annotations

from time import monotonic

from dq.storage.config import EngineConfig

__all__ = ["COLD_SECONDS", "HOT_SECONDS", "AllocationStep", "allocation_step"]

#: a log that uses up its step this soon after allocating it is hot: the next step doubles
HOT_SECONDS = 10.0
#: a log whose step lasted longer than this is cold again: the next step is the base
COLD_SECONDS = 60.0


class AllocationStep:
    """One log's allocation step (the rule in the module docstring)."""

    __slots__ = ("_last", "base", "cap", "step")

    def __init__(self, base: int, cap: int) -> None:
        if base <= 0:
            raise ValueError("an allocation step must be positive")
        self.base = base
        self.cap = max(base, cap)
        self.step = base
        self._last: float | None = None  # when the log last allocated

    def end_for(self, end: int) -> int:
        """Where the log's allocation should end now that a write ending at ``end`` runs
        past its allocated end (called once per allocation: it counts as one)."""
        now = monotonic()
        last, self._last = self._last, now
        if last is not None:
            lasted = now - last
            if lasted < HOT_SECONDS:
                self.step = min(self.step * 2, self.cap)
            elif lasted > COLD_SECONDS:
                self.step = self.base
        step = self.step
        return end + step - end % step


def allocation_step(config: EngineConfig) -> AllocationStep | None:
    """A new log's allocation step under ``config``; None where logs append plainly."""
    if config.wal_prealloc_bytes <= 0:
        return None
    return AllocationStep(config.wal_prealloc_bytes, config.wal_prealloc_max_bytes)
