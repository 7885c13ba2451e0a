"""replica.json: the highest epoch followed is durable before it is used, and never goes back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from dq.server.replication.epochs import FILE_NAME, EpochFile, StaleEpoch
from dq.storage import fileio
from dq.storage.errors import CorruptionError


@pytest.fixture
def steps() -> Iterator[list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []

    def hook(step: str, path: str) -> None:
        seen.append((step, path))

    fileio.FAULTS.append(hook)
    try:
        yield seen
    finally:
        fileio.FAULTS.remove(hook)


def test_a_fresh_directory_has_followed_no_epoch(tmp_path: Path) -> None:
    assert EpochFile(str(tmp_path)).highest() == 0
    assert not (tmp_path / FILE_NAME).exists()


def test_accepted_epochs_survive_a_restart_and_lower_ones_are_refused(tmp_path: Path) -> None:
    epochs = EpochFile(str(tmp_path))
    epochs.accept(7)
    epochs.accept(9)
    assert json.loads((tmp_path / FILE_NAME).read_text()) == {"epoch": 9}
    again = EpochFile(str(tmp_path))
    assert again.highest() == 9
    with pytest.raises(StaleEpoch) as refused:
        again.accept(8)
    assert (refused.value.epoch, refused.value.highest) == (8, 9)
    assert again.highest() == 9
    assert EpochFile(str(tmp_path)).highest() == 9


def test_the_write_is_atomic_and_synced_before_accept_returns(
    tmp_path: Path, steps: list[tuple[str, str]]
) -> None:
    EpochFile(str(tmp_path)).accept(3)
    path = str(tmp_path / FILE_NAME)
    names = [s for s, _ in steps]
    assert names.index("fsync") < names.index("rename") < names.index("fsync_dir")
    assert ("rename", path + ".tmp") in steps or ("rename", path) in steps
    steps.clear()
    EpochFile(str(tmp_path)).accept(3)  # the same epoch again writes nothing
    assert steps == []


def test_the_epoch_survives_a_power_loss(tmp_path: Path) -> None:
    with fileio.simulate_power_loss(str(tmp_path)) as power:
        EpochFile(str(tmp_path)).accept(12)
        power.crash()
        power.power_on()
    assert EpochFile(str(tmp_path)).highest() == 12


def test_a_crash_before_the_rename_keeps_the_old_epoch(tmp_path: Path) -> None:
    epochs = EpochFile(str(tmp_path))
    epochs.accept(4)

    def crash(step: str, path: str) -> None:
        if step == "rename":
            raise OSError("crash before the rename")

    fileio.FAULTS.append(crash)
    try:
        with pytest.raises(OSError):
            epochs.accept(5)
    finally:
        fileio.FAULTS.remove(crash)
    assert epochs.highest() == 4  # never claimed in memory what is not on disk
    assert EpochFile(str(tmp_path)).highest() == 4


@pytest.mark.parametrize("content", [b"", b"{", b'{"epoch": "3"}', b'{"epoch": -1}', b"[]"])
def test_a_damaged_file_is_an_error_not_a_guess(tmp_path: Path, content: bytes) -> None:
    (tmp_path / FILE_NAME).write_bytes(content)
    with pytest.raises(CorruptionError):
        EpochFile(str(tmp_path))
