"""Shared fixtures for engine tests: a fake clock and engine factories that clean up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
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


@pytest.fixture
def engines(tmp_path: Path, open_engine: Callable[..., Engine]) -> Callable[..., Engine]:
    """The engines of a replica group in one process: ``engines(name, **overrides)`` opens
    one on its own data directory ``name``, with ``fsync always``; closed after."""

    def factory(name: str, **overrides: object) -> Engine:
        return open_engine(**{"path": tmp_path / name, "fsync": "always", **overrides})

    return factory
