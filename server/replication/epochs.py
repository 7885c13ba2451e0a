"""The highest leader epoch this node has seen, kept in ``DATA_DIR/replica.json``.

Epochs fence old leaders: a leader's epoch is its etcd key's ``create_revision``, so a
newer leader always has a higher one. A follower writes the epoch to disk (atomically,
fsynced) *before* it first contacts a leader of that epoch, and refuses every lower
epoch from then on, across restarts. A paused or partitioned old leader therefore
collects no acknowledgement from a node that has already followed its successor.

Invariant: ``highest()`` never decreases, and whatever it returned is on disk.
"""

from __future__ import annotations

import json
import os
import threading

from dq.storage import fileio
from dq.storage.errors import CorruptionError

__all__ = ["FILE_NAME", "EpochFile", "StaleEpoch"]

FILE_NAME = "replica.json"


class StaleEpoch(Exception):
    """A leader's epoch is below one this node has already followed."""

    def __init__(self, epoch: int, highest: int) -> None:
        super().__init__(f"epoch {epoch} is older than epoch {highest}, already followed")
        self.epoch = epoch
        self.highest = highest


class EpochFile:
    """``replica.json`` of one data directory: ``{"epoch": E}``."""

    def __init__(self, data_dir: str) -> None:
        self.path = os.path.join(data_dir, FILE_NAME)
        self._lock = threading.Lock()
        self._highest = self._read()

    def _read(self) -> int:
        try:
            with open(self.path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return 0
        try:
            epoch = json.loads(raw)["epoch"]
        except (ValueError, KeyError, TypeError) as exc:
            # written atomically, so a bad file is damage, not a torn write: guessing an
            # epoch could let a fenced leader back in
            raise CorruptionError(f"unreadable epoch file: {exc}", file=self.path) from exc
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise CorruptionError(f"bad epoch {epoch!r}", file=self.path)
        return epoch

    def highest(self) -> int:
        """The highest epoch ever accepted here (0: none yet)."""
        return self._highest

    def accept(self, epoch: int) -> None:
        """Record ``epoch`` durably before its leader is contacted.

        Raises ``StaleEpoch`` if a higher epoch was accepted before. Accepting the
        current epoch again writes nothing.
        """
        if epoch < 0:
            raise ValueError(f"an epoch is never negative: {epoch}")
        with self._lock:
            if epoch < self._highest:
                raise StaleEpoch(epoch, self._highest)
            if epoch == self._highest:
                return
            data = json.dumps({"epoch": epoch}).encode() + b"\n"
            fileio.write_file_atomic(self.path, data)
            self._highest = epoch
