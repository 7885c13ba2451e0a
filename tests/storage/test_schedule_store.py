"""Schedule definitions on disk: durable, one file each, deleted with their schedule (and
its progress forgotten), and an unreadable one left for an operator while the others
fire."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dq.storage import Engine
from dq.storage.errors import ScheduleNotFound
from dq.storage.schedule_store import file_name
from dq.storage.scheduler import Scheduler
from tests.storage.conftest import FakeClock
from tests.storage.schedule_helpers import T0, Q, deadlines, every_second, run


def test_definitions_are_durable_and_deleting_forgets_the_progress(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_schedule(Q, "beat", every_second(value=b"v1"))
    run(Scheduler(e), clock, T0 + 2_000)
    first_id = e.schedule(Q, "beat").id
    assert (Path(e.queue(Q).directory) / file_name("beat")).is_file()
    e.close()
    e2 = open_engine(path=tmp_path / "d")
    s = e2.schedule(Q, "beat")
    assert (s.id, s.value, s.timing.every_ms) == (first_id, b"v1", 1000)
    e2.delete_schedule(Q, "beat")
    with pytest.raises(ScheduleNotFound):
        e2.schedule_info(Q, "beat")
    assert not (Path(e2.queue(Q).directory) / file_name("beat")).exists()
    again = e2.put_schedule(Q, "beat", every_second())
    assert again.schedule.id != first_id
    assert (again.last_tick, again.fired) == (None, 0)


def test_unreadable_definition_is_logged_and_the_others_fire(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_schedule(Q, "good", every_second())
    e.put_schedule(Q, "bad", every_second())
    directory = Path(e.queue(Q).directory)
    e.close()
    (directory / file_name("bad")).write_bytes(b"{not json")
    e2 = open_engine(path=tmp_path / "d")
    assert [i.schedule.name for i in e2.list_schedules(Q)] == ["good"]
    run(Scheduler(e2), clock, T0 + 1000)
    assert deadlines(e2) == [T0 + 1000]
    assert (directory / file_name("bad")).read_bytes() == b"{not json"  # left for an operator


def test_a_backup_holds_the_definitions_and_the_progress(
    open_engine: Callable[..., Engine], clock: FakeClock, tmp_path: Path
) -> None:
    e = open_engine(path=tmp_path / "d")
    e.put_schedule(Q, "beat", every_second(catch_up="all"))
    run(Scheduler(e), clock, T0 + 3_000)
    e.backup(str(tmp_path / "copy"))
    e.close()
    restored = open_engine(path=tmp_path / "copy")
    info = restored.schedule_info(Q, "beat")
    assert (info.last_tick, info.fired) == (T0 + 3000, 3)
    run(Scheduler(restored), clock, T0 + 5_000)
    assert deadlines(restored) == [T0 + 1000 * k for k in range(1, 6)]
