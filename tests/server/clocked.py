"""A test clock for the engine (ms) and the server's monotonic clocks (s) at once."""

from __future__ import annotations


class Clock:
    """Drives both the engine clock (ms) and the consumer idle clock (s)."""

    def __init__(self) -> None:
        self.ms = 1_800_000_000_000

    def __call__(self) -> int:
        return self.ms

    def seconds(self) -> float:
        return self.ms / 1000
