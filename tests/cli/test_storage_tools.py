"""``dq inspect`` and ``dq verify`` run as a user runs them (subprocesses), on real files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release
from dq.storage.wal import WalWriter

pytestmark = pytest.mark.integration  # runs dq as a process

ROOT = Path(__file__).resolve().parents[2]


def dq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dq.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_dir(path: Path) -> None:
    with Engine.open(path, EngineConfig(fsync="never", compaction="inline", auto_merge=False)) as e:
        e.enqueue("jobs", [NewItem(b"v%d" % i) for i in range(300)])
        got = e.dequeue("jobs", 10)
        e.release("jobs", [Release(d.id, d.receipt) for d in got])
        e.freeze("jobs")
        e.enqueue("jobs", [NewItem(b"tail")])


def test_inspect_segment_and_log(tmp_path: Path) -> None:
    make_dir(tmp_path / "d")
    qdir = tmp_path / "d" / "queues" / "jobs"
    [seg] = qdir.glob("*.seg")
    out = dq("inspect", str(seg))
    assert out.returncode == 0, out.stderr
    assert "pending_count 290, tombstone_count 0" in out.stdout  # pairs cancelled at freeze
    assert "first key" in out.stdout and "id=11 pending" in out.stdout
    [log] = qdir.glob("*.log")
    out = dq("inspect", "--entries", str(log))
    assert out.returncode == 0
    assert "1 record, 1 pending entry, 0 tombstones" in out.stdout  # counts agree with nouns
    assert "value=" + b"tail".hex() in out.stdout


def test_verify_clean_then_damaged(tmp_path: Path) -> None:
    make_dir(tmp_path / "d")
    out = dq("verify", str(tmp_path / "d"))
    assert out.returncode == 0 and "no damage" in out.stdout
    [seg] = (tmp_path / "d" / "queues" / "jobs").glob("*.seg")
    data = bytearray(seg.read_bytes())
    data[20] ^= 0xFF  # inside block 0
    seg.write_bytes(bytes(data))
    out = dq("verify", str(tmp_path / "d"))
    assert out.returncode == 1
    assert f"DAMAGE: {seg} @ 16: segment block checksum mismatch" in out.stdout


def test_verify_reports_a_torn_tail_as_a_note(tmp_path: Path) -> None:
    make_dir(tmp_path / "d")
    [log] = (tmp_path / "d" / "queues" / "jobs").glob("*.log")
    with open(log, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    out = dq("verify", str(tmp_path / "d"))
    assert out.returncode == 0
    assert "note:" in out.stdout and "torn tail of 11 bytes" in out.stdout
    assert out.stdout.rstrip().endswith("0 damaged, 1 note")


def test_inspect_rejects_other_files(tmp_path: Path) -> None:
    p = tmp_path / "x.bin"
    p.write_bytes(b"hello world")
    out = dq("inspect", str(p))
    assert out.returncode == 1 and "unknown magic" in out.stderr


def test_verify_checks_what_opening_a_queue_checks(tmp_path: Path) -> None:
    """A damaged metadata sidecar or state.json quarantines a queue when it opens, so
    ``dq verify`` reports them too: "no damage" must mean the queue will serve."""
    cfg = EngineConfig(fsync="never", compaction="inline", auto_merge=False)
    with Engine.open(tmp_path / "d", cfg) as e:
        e.enqueue("jobs", [NewItem(b"once", key="order-7")])
        e.freeze("jobs")  # its key moves to 0000000001.meta
        e.pause("jobs")
    qdir = tmp_path / "d" / "queues" / "jobs"
    sidecar = qdir / "0000000001.meta"
    data = bytearray(sidecar.read_bytes())
    data[-1] ^= 0xFF
    sidecar.write_bytes(bytes(data))
    (qdir / "state.json").write_text("[]")
    out = dq("verify", str(tmp_path / "d"))
    assert out.returncode == 1
    assert f"DAMAGE: {sidecar} @ 0: metadata sidecar checksum mismatch" in out.stdout
    assert f"DAMAGE: {qdir / 'state.json'}" in out.stdout
    assert "unreadable state.json: not a JSON object" in out.stdout


def test_verify_takes_two_open_logs_for_a_crash_during_rotation(tmp_path: Path) -> None:
    """A rotation creates the next log before it renames the current one ``.log_ro``: a
    crash in between leaves two ``.log`` files, which recovery freezes both. That is a
    note, not damage: the salvage steps must not send an operator after it."""
    make_dir(tmp_path / "d")
    qdir = tmp_path / "d" / "queues" / "jobs"
    [log] = qdir.glob("*.log")
    WalWriter.create(str(qdir), int(log.stem) + 1, 1000).abandon()
    out = dq("verify", str(tmp_path / "d"))
    assert out.returncode == 0, out.stdout
    assert "note:" in out.stdout and "more than one open log" in out.stdout
    with Engine.open(tmp_path / "d", EngineConfig(fsync="never", compaction="inline")) as e:
        assert len(e.dequeue("jobs", 1000)) == 291  # 290 in the segment and the tail
