"""The simulated power-loss layer itself: a crash keeps exactly what was made durable.

Each case writes through ``dq.storage.fileio`` the way the engine does, crashes, and reads
the directory back: bytes count once their file is fsynced, names once their directory
is. These tests pin the layer's model of POSIX; the engine is tested with it in
``test_model.py``, ``test_fault_matrix.py`` and ``test_crash.py``.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from dq.storage import fileio


def _new(path: Path, data: bytes, *, sync: bool = True) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    fileio.write_all(fd, data, str(path))
    if sync:
        fileio.fsync(fd, str(path))
    return fd


def test_unsynced_bytes_are_lost_synced_bytes_kept(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    log = root / "a.log"
    with fileio.simulate_power_loss(str(root)) as power:
        fd = _new(log, b"header")
        fileio.fsync_dir(str(root))
        fileio.pwrite_all(fd, b"-one", 6, str(log))
        fileio.fdatasync(fd, str(log))
        fileio.pwrite_all(fd, b"-two", 10, str(log))
        key = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
        assert power.durable(key, 6, 10) and not power.durable(key, 10, 14)
        assert log.read_bytes() == b"header-one-two"  # the running process sees it all
        power.crash()
        fileio.pwrite_all(fd, b"-three", 14, str(log))  # a dead process writes nothing
        fileio.fdatasync(fd, str(log))
        os.close(fd)
        assert log.read_bytes() == b"header-one"


def test_overwrite_and_truncate_are_undone(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    f = root / "f"
    with fileio.simulate_power_loss(str(root)) as power:
        fd = _new(f, b"0123456789")
        fileio.fsync_dir(str(root))
        fileio.pwrite_all(fd, b"ab", 2, str(f))
        fileio.truncate(fd, 5, str(f))
        fileio.pwrite_all(fd, b"XYZ", 4, str(f))
        assert f.read_bytes() == b"01abXYZ"
        os.close(fd)
        power.crash()
        assert f.read_bytes() == b"0123456789"


def test_names_count_once_their_directory_is_synced(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "q").mkdir(parents=True)
    q = root / "q"
    with fileio.simulate_power_loss(str(root)) as power:
        fileio.write_file_atomic(str(q / "kept.json"), b"kept")  # syncs the directory
        os.close(_new(q / "7.log", b"log seven"))
        fileio.fsync_dir(str(q))
        os.close(_new(q / "new.tmp", b"never named durably"))
        fileio.rename(str(q / "7.log"), str(q / "7.log_ro"))  # directory not synced
        fileio.remove(str(q / "kept.json"))  # directory not synced
        power.crash()
        assert sorted(os.listdir(q)) == ["7.log", "kept.json"]
        assert (q / "7.log").read_bytes() == b"log seven"
        assert (q / "kept.json").read_bytes() == b"kept"
        power.power_on()
        fileio.rename(str(q / "7.log"), str(q / "7.log_ro"))
        fileio.remove(str(q / "kept.json"))
        fileio.fsync_dir(str(q))
        power.crash()
        assert os.listdir(q) == ["7.log_ro"]


def test_a_created_file_is_empty_unless_synced(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    with fileio.simulate_power_loss(str(root)) as power:
        os.close(_new(root / "unsynced", b"data", sync=False))
        os.close(_new(root / "synced", b"data"))
        fileio.fsync_dir(str(root))  # both names durable, only one file's bytes
        power.crash()
        assert (root / "unsynced").read_bytes() == b""
        assert (root / "synced").read_bytes() == b"data"


def test_a_renamed_directory_goes_back(tmp_path: Path) -> None:
    root = tmp_path / "data"
    (root / "queues" / "jobs").mkdir(parents=True)
    (root / "queues" / "jobs" / "queue.json").write_bytes(b"{}")
    with fileio.simulate_power_loss(str(root)) as power:
        fileio.rename(str(root / "queues" / "jobs"), str(root / "queues" / ".deleted-jobs"))
        power.crash()
        assert os.listdir(root / "queues") == ["jobs"]
        assert (root / "queues" / "jobs" / "queue.json").read_bytes() == b"{}"


def test_kill_keeps_the_page_cache_and_drops_later_io(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    f = root / "f"
    with fileio.simulate_power_loss(str(root)) as power:
        fd = _new(f, b"synced")
        fileio.fsync_dir(str(root))
        fileio.pwrite_all(fd, b"+cache", 6, str(f))
        power.kill()
        fileio.pwrite_all(fd, b"+dead", 12, str(f))
        os.close(fd)
        assert f.read_bytes() == b"synced+cache"


def test_torn_crashes_keep_a_prefix_of_the_unsynced_tail(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    f = root / "f"
    seen: set[bytes] = set()
    for seed in range(40):
        f.unlink(missing_ok=True)
        with fileio.simulate_power_loss(str(root)) as power:
            fd = _new(f, b"durable")
            fileio.fsync_dir(str(root))
            fileio.pwrite_all(fd, b"TAIL", 7, str(f))
            os.close(fd)
            power.crash(random.Random(seed))
            data = f.read_bytes()
        assert data[:7] == b"durable"
        tail = data[7:]
        assert b"TAIL".startswith(tail) or tail == bytes(len(tail)), data
        seen.add(tail)
    assert b"" in seen and len(seen) > 2  # sometimes clean, sometimes torn
