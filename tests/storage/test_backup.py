"""Online backup under load: writers and consumers keep going while the copy is made;
everything acknowledged before the backup began is in the copy, nothing released
before it comes back, and the copy passes ``dq verify``."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, QueueConfig, Release
from dq.storage.errors import InvalidArgument
from dq.storage.tools import verify_data_dir

pytestmark = pytest.mark.timeout(180)


@pytest.mark.integration
def test_backup_under_load_holds_everything_acknowledged_before_it(tmp_path: Path) -> None:
    config = EngineConfig(fsync="always", memseg_bytes=64 * 1024, compaction="thread")
    engine = Engine.open(tmp_path / "data", config)
    engine.put_queue("work", QueueConfig())
    stop = threading.Event()
    lock = threading.Lock()
    acked: list[tuple[float, str, int]] = []  # (when acknowledged, kind, id)
    keys: dict[str, tuple[float, int]] = {}  # key -> (when acknowledged, id)

    def producer(n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            batch = [NewItem(f"{n}-{i}-{j}".encode() * 10, key=f"{n}-{i}-{j}") for j in range(10)]
            got = engine.enqueue("work" if n else "keep", batch)
            now = time.monotonic()
            with lock:
                acked.extend((now, "E" if n else "K", g.id) for g in got)
                keys.update((b.key or "", (now, g.id)) for b, g in zip(batch, got, strict=True))

    def consumer() -> None:
        while not stop.is_set():
            items = engine.dequeue("work", 20, 60_000) if "work" in engine.list_queues() else []
            if not items:
                time.sleep(0.001)
                continue
            with lock:  # from now on a release may become durable at any moment
                acked.extend((0.0, "D", d.id) for d in items)
            out = engine.release("work", [Release(d.id, d.receipt) for d in items])
            now = time.monotonic()
            with lock:
                acked.extend((now, "R", o.id) for o in out if o.ok)

    threads = [threading.Thread(target=producer, args=(n,)) for n in range(3)]
    threads.append(threading.Thread(target=consumer))
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)  # logs rotate, segments are written and merged meanwhile
        began = time.monotonic()
        result = engine.backup(str(tmp_path / "copy"))
        time.sleep(0.3)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    with lock:
        before = [(kind, i) for when, kind, i in acked if when < began]
        keys_before = {k: i for k, (when, i) in keys.items() if when < began}
    engine.close()
    assert result.bytes > 0 and set(result.queues) == {"work", "keep"}
    assert [p for p in verify_data_dir(str(tmp_path / "copy")) if p.damage] == []
    enqueued = {i for k, i in before if k == "E"}
    released = {i for k, i in before if k == "R"}
    dequeued = {i for k, i in before if k == "D"} | {i for _w, k, i in acked if k == "D"}
    kept = {i for k, i in before if k == "K"}
    assert enqueued and released and kept, "the load acknowledged nothing before the backup"
    with Engine.open(tmp_path / "copy", EngineConfig(fsync="never")) as copy:
        present: set[int] = set()
        while got := copy.dequeue("work", 1000, 60_000):
            present.update(d.id for d in got)
        # a release in flight when the copy was made may go either way; acknowledged
        # ones must not come back; acknowledged enqueues never dequeued must be there
        assert not (released & present), "releases acknowledged before the backup came back"
        missing = enqueued - dequeued - present
        assert not missing, (
            f"{len(missing)} acknowledged enqueues missing, e.g. {sorted(missing)[:5]}"
        )
        kept_present: set[int] = set()
        while got := copy.dequeue("keep", 1000, 60_000):
            kept_present.update(d.id for d in got)
        assert kept <= kept_present
        # keys travel with their items into the copy
        sample = sorted(k for k in keys_before if k.startswith("0-"))[:200]
        again = copy.enqueue("keep", [NewItem(b"x", key=k) for k in sample])
        assert all(
            g.duplicate and g.id == keys_before[k] for k, g in zip(sample, again, strict=True)
        )


def test_backup_refuses_an_existing_or_inner_destination(tmp_path: Path) -> None:
    with Engine.open(tmp_path / "data", EngineConfig(fsync="never")) as engine:
        engine.enqueue("q", [NewItem(b"a")])
        (tmp_path / "there").mkdir()
        with pytest.raises(InvalidArgument, match="exists"):
            engine.backup(str(tmp_path / "there"))
        with pytest.raises(InvalidArgument, match="inside the data directory"):
            engine.backup(str(tmp_path / "data" / "b"))
        with pytest.raises(InvalidArgument, match="does not exist"):
            engine.backup(str(tmp_path / "no" / "b"))
