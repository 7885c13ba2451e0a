"""A snapshot tar is unpacked as untrusted input, durably, and leaves nothing behind on failure."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from dq.server.replication.snapshot_files import (
    PREFIX,
    BadSnapshot,
    SnapshotInfo,
    remove_leftovers,
    unpack_snapshot,
)
from dq.storage import fileio

MANIFEST = json.dumps({"epoch": 5, "lsn": 40, "queues": {"a": 38, "b": 40}}).encode()


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    out.seek(0)
    return out


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def _dir(name: str) -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    return info, None


def _special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def _good() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    return [
        _dir("."),
        _file("snapshot.json", MANIFEST),
        _dir("queues"),
        _dir("queues/a"),
        _file("queues/a/queue.json", b'{"x": 1}'),
        _file("queues/a/00000001.log", b"log bytes"),
        _dir("queues/b"),
        _file("./queues/b/00000002.seg", b"segment"),
    ]


@pytest.fixture(params=["data_filter", "without data_filter"])
def tar_filter(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of unpacking: with tarfile's ``data`` filter, and as on a Python that
    lacks it (Debian 12's 3.11.2, the container image's)."""
    if request.param != "data_filter":
        if sys.version_info >= (3, 12):
            pytest.skip("Python 3.12 and later always have the data filter")
        monkeypatch.delattr(tarfile, "data_filter")
    return str(request.param)


def _leftovers(data_dir: Path) -> list[str]:
    return sorted(n for n in os.listdir(data_dir) if n.startswith(PREFIX))


def test_a_snapshot_is_unpacked_inside_the_data_dir_and_synced(
    tmp_path: Path, tar_filter: str
) -> None:
    synced: list[tuple[str, str]] = []

    def hook(step: str, path: str) -> None:
        if step in ("fsync", "fsync_dir"):
            synced.append((step, os.path.relpath(path, tmp_path)))

    fileio.FAULTS.append(hook)
    try:
        dest, info = unpack_snapshot(_tar(*_good()), str(tmp_path))
    finally:
        fileio.FAULTS.remove(hook)
    assert info == SnapshotInfo(5, 40, {"a": 38, "b": 40})
    assert os.path.dirname(dest) == str(tmp_path) and _leftovers(tmp_path) == [
        os.path.basename(dest)
    ]
    root = Path(dest)
    assert (root / "queues/a/00000001.log").read_bytes() == b"log bytes"
    assert (root / "queues/b/00000002.seg").read_bytes() == b"segment"
    top = os.path.basename(dest)
    files = {f"{top}/{f}" for f in ("snapshot.json", "queues/a/queue.json", "queues/a/00000001.log", "queues/b/00000002.seg")}  # fmt: skip
    dirs = {top, f"{top}/queues", f"{top}/queues/a", f"{top}/queues/b", "."}
    assert files <= {p for s, p in synced if s == "fsync"}
    assert dirs <= {p for s, p in synced if s == "fsync_dir"}
    # every directory is synced after what it holds
    order = [p for _, p in synced]
    assert order.index(f"{top}/queues/a") > order.index(f"{top}/queues/a/00000001.log")
    assert order.index(top) > order.index(f"{top}/queues")


def test_a_snapshot_of_no_queue_still_has_a_queues_directory(tmp_path: Path) -> None:
    manifest = json.dumps({"epoch": 1, "lsn": 0, "queues": {}}).encode()
    dest, info = unpack_snapshot(_tar(_file("snapshot.json", manifest)), str(tmp_path))
    assert info.lsn == 0 and os.listdir(os.path.join(dest, "queues")) == []


def test_covers_uses_the_queue_lsn_else_the_snapshot_lsn() -> None:
    info = SnapshotInfo(5, 40, {"a": 38, "b": 45})
    assert info.covers("a", 38) and not info.covers("a", 39)
    assert info.covers("b", 45) and not info.covers("b", 46)
    assert info.covers("new", 40) and not info.covers("new", 41)


UNSAFE: dict[str, list[tuple[tarfile.TarInfo, bytes | None]]] = {
    "absolute name": [_file("/tmp/dq-escape", b"x")],
    "dot-dot": [_file("queues/../../dq-escape", b"x")],
    "leading dot-dot": [_file("../dq-escape", b"x")],
    "symlink": [_special("queues/a/link", tarfile.SYMTYPE, "../../..")],
    "relative symlink": [_special("queues/a/link", tarfile.SYMTYPE, "queue.json")],
    "hard link": [_file("queues/a/f", b"x"), _special("queues/a/h", tarfile.LNKTYPE, "queues/a/f")],
    "device": [_special("queues/a/dev", tarfile.CHRTYPE)],
    "fifo": [_special("queues/a/fifo", tarfile.FIFOTYPE)],
    "unexpected top level": [_file("LOCK", b"")],
    "manifest as a directory": [_dir("snapshot.json")],
    "under the manifest": [_file("snapshot.json/x", b"")],
}


@pytest.mark.parametrize("case", sorted(UNSAFE))
def test_unsafe_members_are_refused_and_nothing_is_left(
    tmp_path: Path, case: str, tar_filter: str
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    members = [_file("snapshot.json", MANIFEST), *UNSAFE[case]]
    with pytest.raises(BadSnapshot):
        unpack_snapshot(_tar(*members), str(data))
    assert os.listdir(data) == []
    assert sorted(os.listdir(tmp_path)) == ["data"]
    assert not Path("/tmp/dq-escape").exists()


@pytest.mark.parametrize(
    "manifest",
    [
        None,
        b"not json",
        b'{"epoch": 1, "lsn": 2}',
        b'{"epoch": 1, "lsn": -2, "queues": {}}',
        b'{"epoch": 1, "lsn": 2, "queues": {"a": "3"}}',
        b'{"epoch": true, "lsn": 2, "queues": {}}',
    ],
)
def test_a_missing_or_bad_manifest_is_refused(tmp_path: Path, manifest: bytes | None) -> None:
    members = [m for m in _good() if m[0].name != "snapshot.json"]
    if manifest is not None:
        members.append(_file("snapshot.json", manifest))
    with pytest.raises(BadSnapshot):
        unpack_snapshot(_tar(*members), str(tmp_path))
    assert _leftovers(tmp_path) == []


def test_a_stream_cut_short_leaves_nothing(tmp_path: Path) -> None:
    whole = _tar(*_good()).getvalue()
    with pytest.raises((BadSnapshot, tarfile.TarError)):
        unpack_snapshot(io.BytesIO(whole[: len(whole) // 2]), str(tmp_path))
    assert _leftovers(tmp_path) == []


def test_the_check_can_abandon_the_transfer(tmp_path: Path) -> None:
    calls: list[int] = []

    class Abandon(Exception):
        pass

    def check() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise Abandon

    stop: Callable[[], None] = check
    with pytest.raises(Abandon):
        unpack_snapshot(_tar(*_good()), str(tmp_path), stop)
    assert len(calls) == 3 and _leftovers(tmp_path) == []


def test_leftovers_of_a_crash_are_removed_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / f"{PREFIX}abc" / "queues").mkdir(parents=True)
    (tmp_path / "queues").mkdir()
    (tmp_path / "replica.json").write_text("{}")
    remove_leftovers(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["queues", "replica.json"]


@pytest.mark.parametrize("cut", ["at a member boundary", "inside a member", "inside a header"])
def test_an_archive_without_its_end_marker_is_refused(tmp_path: Path, cut: str) -> None:
    """tarfile itself ends quietly at a missing header: a cut at a member boundary
    would pass for a complete snapshot missing its last queues."""
    members = _good()
    whole = _tar(*members).getvalue()
    boundary = _tar(*members[:-1]).getvalue().rstrip(b"\0")
    boundary += b"\0" * (-len(boundary) % 512)
    stream = {
        "at a member boundary": boundary,
        "inside a member": whole[: len(boundary) + 512 + 3],
        "inside a header": whole[: len(boundary) + 100],
    }[cut]
    with pytest.raises((BadSnapshot, tarfile.TarError)):
        unpack_snapshot(io.BytesIO(stream), str(tmp_path))
    assert _leftovers(tmp_path) == []


def test_bytes_after_the_end_marker_are_refused(tmp_path: Path) -> None:
    whole = _tar(*_good()).getvalue() + b"more"
    with pytest.raises(BadSnapshot):
        unpack_snapshot(io.BytesIO(whole), str(tmp_path))
    assert _leftovers(tmp_path) == []
