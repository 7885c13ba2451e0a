"""Shared fixtures for engine tests: a fake clock and an engine factory that cleans up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig


class FakeClock:
    """Milliseconds since the epoch, moved only by the test."""

    def __init__(self, start: int = 1_800_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def open_engine(tmp_path: Path, clock: FakeClock) -> Iterator:
    engines: list[Engine] = []

    def factory(**overrides: object) -> Engine:
        path = overrides.pop("path", tmp_path / "data")
        cfg = EngineConfig(
            **{"fsync": "never", "compaction": "inline", "auto_merge": False, **overrides}
        )
        e = Engine.open(path, cfg, clock=clock)
        engines.append(e)
        return e

    yield factory
    for e in engines:
        e.close()
