"""One damaged queue never stops the engine: it is quarantined (kept as it is, named in
the log with file and offset) and answers 503 naming them, while the others serve."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dq.server.errors import status_for
from dq.storage import Engine, EngineConfig, NewItem, QueueConfig
from dq.storage.errors import QueueDamaged
from dq.storage.wal import HEADER, RECORD_HEADER
from tests.storage.conftest import FakeClock


def test_a_damaged_queue_is_quarantined_and_the_others_serve(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    with Engine.open(path, cfg, clock=clock) as e:
        e.enqueue("good", [NewItem(b"fine")])
        for i in range(3):
            e.enqueue("bad", [NewItem(b"item-%d" % i)])
    log_file = path / "queues" / "bad" / "0000000001.log"
    data = bytearray(log_file.read_bytes())
    second = HEADER.size + RECORD_HEADER.size + int.from_bytes(data[32:36], "big")
    data[second + RECORD_HEADER.size + 3] ^= 0x01  # a complete record, followed by another
    log_file.write_bytes(bytes(data))

    with caplog.at_level(logging.ERROR), Engine.open(path, cfg, clock=clock) as e:
        assert e.list_queues() == ["bad", "good"]
        assert [d.value for d in e.dequeue("good")] == [b"fine"]
        e.enqueue("good", [NewItem(b"more")])
        where = str(log_file)
        for op in (
            lambda: e.dequeue("bad"),
            lambda: e.enqueue("bad", [NewItem(b"x")]),
            lambda: e.put_queue("bad", QueueConfig()),
            lambda: e.peek("bad", 1),  # not "never assigned": the log says nothing yet
        ):
            with pytest.raises(QueueDamaged) as err:
                op()
            assert err.value.context["file"] == where
            assert err.value.context["offset"] == second
            assert where in err.value.message and str(second) in err.value.message
            assert status_for(err.value) == 503
        assert e.stats("bad").extra["damaged"] == 1
        assert any(
            where in r.getMessage() and str(second) in r.getMessage() for r in caplog.records
        )
    assert log_file.read_bytes() == bytes(data)  # kept exactly as it was


def test_peek_in_a_queue_whose_segment_is_damaged_answers_the_damage(
    tmp_path: Path, clock: FakeClock
) -> None:
    """Peek of an item in a quarantined queue is its 503, not ``"gone"``: an operator
    looking for an item must not be told it was released while it waits on disk."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    with Engine.open(path, cfg, clock=clock) as e:
        ids = e.enqueue("q", [NewItem(b"item-%d" % i) for i in range(3)])
        e.freeze("q")
    (seg,) = (path / "queues" / "q").glob("*.seg")
    data = bytearray(seg.read_bytes())
    data[40] ^= 0xFF  # inside the first (only) block
    seg.write_bytes(bytes(data))
    with Engine.open(path, cfg, clock=clock) as e:
        for item in ids:
            with pytest.raises(QueueDamaged) as err:
                e.peek("q", item.id)
            assert err.value.context["file"] == str(seg)


@pytest.mark.parametrize("name", ["queue.json", "state.json"])
def test_an_unreadable_settings_file_is_named_with_its_offset(
    tmp_path: Path, clock: FakeClock, name: str
) -> None:
    """The quarantine names the file an operator must rewrite or remove, and where its
    JSON breaks off; not only the queue's directory."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    with Engine.open(path, cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"kept")])
        e.pause("q")  # writes state.json
    broken = path / "queues" / "q" / name
    broken.write_text('{"version": 1, "paused_')
    with Engine.open(path, cfg, clock=clock) as e:
        with pytest.raises(QueueDamaged) as err:
            e.dequeue("q")
        assert err.value.context["file"] == str(broken)
        assert err.value.context["offset"] == 15
        assert f"{broken} offset 15: unreadable {name}" in err.value.message


@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("state.json", "[]", "not a JSON object but list"),
        ("state.json", '{"version": 1, "paused_since": "yes"}', "paused_since is 'yes'"),
        ("queue.json", "1", "not a JSON object but int"),
        ("queue.json", '{"version": 1, "default_lease_ms": "abc"}', "default_lease_ms is 'abc'"),
    ],
)
def test_a_settings_file_that_is_not_what_dq_writes_quarantines_its_queue(
    tmp_path: Path, clock: FakeClock, name: str, content: str, says: str
) -> None:
    """JSON that parses but is not dq's settings is damage like unparsable JSON: the
    queue is quarantined and the others serve (it used to stop the engine opening, or
    answer every dequeue 400 for a lease of "abc")."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    with Engine.open(path, cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"kept")])
        e.enqueue("good", [NewItem(b"fine")])
        e.pause("q")
    (path / "queues" / "q" / name).write_text(content)
    with Engine.open(path, cfg, clock=clock) as e:
        assert [d.value for d in e.dequeue("good")] == [b"fine"]
        with pytest.raises(QueueDamaged) as err:
            e.dequeue("q")
        assert err.value.context["file"] == str(path / "queues" / "q" / name)
        assert says in err.value.message


def test_a_queue_directory_that_lost_its_queue_json_is_quarantined_not_recreated(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A directory holding a queue's logs and segments but no ``queue.json`` is damage,
    not an interrupted creation: were it ignored, the next enqueue would create the
    queue afresh in it (ids from 1 again), and the next start would delete the new
    queue's log 1 as covered by the old ``1-1.seg``: an acknowledged enqueue lost."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    path = tmp_path / "d"
    with Engine.open(path, cfg, clock=clock) as e:
        e.enqueue("q", [NewItem(b"old")])
        e.freeze("q")  # 0000000001-0000000001.seg
    (path / "queues" / "q" / "queue.json").unlink()
    (path / "queues" / "half").mkdir()  # what an interrupted creation leaves
    (path / "queues" / "half" / "queue.json.tmp").write_bytes(b"{")
    with Engine.open(path, cfg, clock=clock) as e:
        assert e.list_queues() == ["q"]
        with pytest.raises(QueueDamaged) as err:
            e.enqueue("q", [NewItem(b"new")])
        assert err.value.context["file"] == str(path / "queues" / "q" / "queue.json")
        e.enqueue("half", [NewItem(b"fresh")])  # an interrupted creation is created again
    assert (path / "queues" / "q" / "0000000001-0000000001.seg").exists()
    assert not (path / "queues" / "q" / "0000000001.log").exists()
