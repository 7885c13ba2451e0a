"""Simulated power loss: unsynced writes are kept apart and dropped at a simulated crash.

The idea of LazyFS and of SQLite's crash tests, inside the engine's one I/O module. A
SIGKILL keeps the page cache, so it never shows what a machine that loses power shows:
whatever was written but not yet synced is gone. While a ``PowerLoss`` is installed
(``dq.storage.fileio.POWER``), every mutating step of ``dq.storage.fileio`` is checked against
the durability rules of POSIX:

- a file's bytes are durable once the file is fsynced (``fsync``/``fdatasync``);
- a directory entry — a file created, renamed in, or unlinked — is durable once its
  directory is fsynced (``fsync_dir``).

``crash()`` rolls every file and directory under ``root`` back to that durable state,
as a machine that lost power would find them after reboot, and from then on drops every
further I/O of the dying process (its threads may run on, but nothing they do reaches
the disk). ``kill()`` is a process crash instead: the disk stays as it is and only the
later I/O is dropped. ``power_on()`` takes what is on disk as durable and lets I/O
through again, for the next engine to open.

Bookkeeping: per inode, the size it had when it was last synced and undo records — the
old bytes of every unsynced write or truncation that touched its durable range; per
directory, its listing (name → inode) as of its last fsync. An unlinked or replaced
file is kept alive by a hard link in a stash directory beside ``root``, so a rollback
can bring it back. Files written by another process (the compaction worker) are not
seen: use ``compaction="thread"`` or ``"inline"`` with this layer.

Because durability is modelled here, the real ``fsync`` calls are skipped unless
``sync_to_disk`` is set: tests run at the speed of the page cache.
"""

from __future__ import annotations

import os
import random
import shutil
import stat
import threading
from dataclasses import dataclass, field

__all__ = ["Key", "PowerLoss"]

#: (st_dev, st_ino): an inode
Key = tuple[int, int]


@dataclass
class _Inode:
    """What a file held when it was last synced, as undo records over its current bytes."""

    durable_size: int
    #: (offset, old bytes) within the durable range, oldest first
    undo: list[tuple[int, bytes]] = field(default_factory=list)


def _key(st: os.stat_result) -> Key:
    return (st.st_dev, st.st_ino)


def _listing(directory: str) -> dict[str, tuple[Key, bool]]:
    out: dict[str, tuple[Key, bool]] = {}
    with os.scandir(directory) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            out[entry.name] = (_key(st), stat.S_ISDIR(st.st_mode))
    return out


class PowerLoss:
    """Tracks what is durable under ``root``; see the module docstring."""

    def __init__(self, root: str, *, sync_to_disk: bool = False) -> None:
        self.root = os.path.abspath(root)
        self.sync_to_disk = sync_to_disk
        #: held around every tracked step, so a crash happens between two steps
        self.lock = threading.RLock()
        #: the process has "died": every further mutating step is dropped
        self.dead = False
        self.stash = os.path.join(
            os.path.dirname(self.root), f".{os.path.basename(self.root)}.powerloss"
        )
        self._inodes: dict[Key, _Inode] = {}
        self._synced: dict[Key, int] = {}
        self._listings: dict[str, dict[str, tuple[Key, bool]]] = {}
        self.crashes = 0
        self.power_on()

    # ------------------------------------------------------------------ state

    def power_on(self) -> None:
        """What is on disk now is durable; I/O reaches the disk again."""
        with self.lock:
            self._inodes.clear()
            self._synced.clear()
            self._listings.clear()
            shutil.rmtree(self.stash, ignore_errors=True)
            os.makedirs(self.stash)
            if os.path.isdir(self.root):
                for directory, _dirs, _files in os.walk(self.root):
                    self._listings[os.path.abspath(directory)] = _listing(directory)
            self.dead = False

    def kill(self) -> None:
        """A process crash: the disk keeps everything; later I/O of this process is dropped."""
        with self.lock:
            self.dead = True

    def crash(self, rng: random.Random | None = None) -> None:
        """Power loss: roll back to the durable state, then drop every later I/O.

        With ``rng``, each file keeps a random part of its unsynced appended bytes
        (sometimes as zeros, as a file system that grew the file but never wrote its
        blocks leaves them) and each directory may keep its unsynced entries: the
        torn states a real crash can leave, not only the cleanest one.
        """
        with self.lock:
            if not self.dead:
                self._rollback(rng)
                self.crashes += 1
            self.dead = True

    def close(self) -> None:
        """Remove the stash (when the layer is taken out)."""
        shutil.rmtree(self.stash, ignore_errors=True)

    # ------------------------------------------------------------------ queries

    def durable(self, key: Key, start: int, end: int) -> bool:
        """Are bytes ``[start, end)`` of inode ``key`` durable (synced and not since changed)?"""
        with self.lock:
            node = self._inodes.get(key)
            if node is None:
                return end <= self._synced.get(key, 0)
            if end > node.durable_size:
                return False
            return all(off + len(old) <= start or off >= end for off, old in node.undo)

    # ------------------------------------------------------------------ hooks (under lock)

    def _inode(self, fd: int) -> _Inode:
        st = os.fstat(fd)
        key = _key(st)
        node = self._inodes.get(key)
        if node is None:
            # the first change since the last sync: what the file holds now is durable
            # (a file created since then is empty, and that is its durable content)
            node = self._inodes[key] = _Inode(st.st_size)
        return node

    def _old_bytes(self, fd: int, node: _Inode, start: int, end: int) -> None:
        end = min(end, node.durable_size)
        if start >= end:
            return
        rfd = os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            old = os.pread(rfd, end - start, start)
        finally:
            os.close(rfd)
        node.undo.append((start, old))

    def before_write(self, fd: int, offset: int | None, length: int) -> None:
        if offset is None:
            offset = os.lseek(fd, 0, os.SEEK_CUR)
        self._old_bytes(fd, self._inode(fd), offset, offset + length)

    def before_truncate(self, fd: int, size: int) -> None:
        node = self._inode(fd)
        self._old_bytes(fd, node, size, node.durable_size)

    def before_create(self, path: str) -> None:
        """An existing file is about to be emptied: its durable bytes may come back."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            self.before_truncate(fd, 0)
        finally:
            os.close(fd)

    def synced(self, fd: int) -> None:
        st = os.fstat(fd)
        key = _key(st)
        self._inodes.pop(key, None)
        self._synced[key] = st.st_size

    def dir_synced(self, path: str) -> None:
        path = os.path.abspath(path)
        if path == self.root or path.startswith(self.root + os.sep):
            self._listings[path] = _listing(path)

    def before_unlink(self, path: str) -> None:
        """Keep the inode alive (a rollback may bring the name back)."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st.st_mode):
            self._stash_link(path, _key(st))

    def _stash_link(self, path: str, key: Key) -> None:
        target = os.path.join(self.stash, f"{key[0]}-{key[1]}")
        if not os.path.exists(target):
            os.link(path, target)

    # ------------------------------------------------------------------ rollback

    def _walk(self) -> tuple[dict[Key, str], dict[Key, str]]:
        files: dict[Key, str] = {}
        dirs: dict[Key, str] = {}
        for directory, subdirs, names in os.walk(self.root):
            for name in subdirs:
                path = os.path.join(directory, name)
                dirs[_key(os.lstat(path))] = path
            for name in names:
                path = os.path.join(directory, name)
                files[_key(os.lstat(path))] = path
        return files, dirs

    def _rollback(self, rng: random.Random | None) -> None:
        files, _dirs = self._walk()
        for key, path in files.items():
            self._stash_link(path, key)
        self._restore_dir(self.root, rng)
        files, _dirs = self._walk()
        for key, node in self._inodes.items():
            found = files.get(key)
            if found is not None:
                self._restore_file(found, node, rng)

    def _restore_dir(self, path: str, rng: random.Random | None) -> None:
        durable = self._listings.get(path, {})
        if rng is not None and path in self._listings and rng.random() < 0.3:
            durable = _listing(path)  # this directory's metadata happened to reach the disk
        # directories renamed since: move them back under their durable name
        _files, dirs = self._walk()
        for name, (key, is_dir) in durable.items():
            target = os.path.join(path, name)
            if is_dir and not os.path.isdir(target):
                source = dirs.get(key)
                if source is not None and not source.startswith(target + os.sep):
                    os.rename(source, target)
                else:
                    os.makedirs(target)
        for name, (key, is_dir) in _listing(path).items():
            current = os.path.join(path, name)
            if durable.get(name) == (key, is_dir):
                continue
            if is_dir:
                if name in durable and durable[name][1]:
                    continue  # the same name, a directory made again: keep, clear below
                shutil.rmtree(current)
            else:
                os.unlink(current)
        for name, (key, is_dir) in durable.items():
            target = os.path.join(path, name)
            if is_dir:
                self._restore_dir(target, rng)
            elif not os.path.lexists(target):
                source = os.path.join(self.stash, f"{key[0]}-{key[1]}")
                if os.path.exists(source):
                    os.link(source, target)

    def _restore_file(self, path: str, node: _Inode, rng: random.Random | None) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            keep = node.durable_size
            tail = b""
            if rng is not None and size > keep and rng.random() < 0.5:
                n = rng.randint(0, size - keep)
                tail = os.pread(fd, n, keep)
                if rng.random() < 0.25:
                    tail = bytes(len(tail))
            for offset, old in reversed(node.undo):
                os.pwrite(fd, old, offset)
            os.ftruncate(fd, keep)
            if tail:
                os.pwrite(fd, tail, keep)
            os.fsync(fd)
        finally:
            os.close(fd)
