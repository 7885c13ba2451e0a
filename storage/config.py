"""The engine's settings (``EngineConfig``): a module of its own so that the queue, the
engine and the server can all read them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass

from dq.storage.errors import InvalidArgument
from dq.storage.types import FsyncMode

__all__ = ["EngineConfig"]


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings; the server builds one from ``DQ_*`` variables and flags."""

    fsync: FsyncMode = "always"
    fsync_interval_ms: int = 50
    max_value_bytes: int = 1 << 20
    max_batch: int = 1000
    #: a log (and its in-memory segment) is frozen when it reaches this size
    memseg_bytes: int = 16 << 20
    #: logs grow ahead of their data in steps allocated without being written, this
    #: size first (0: plain appends), so a durable round's ``fdatasync`` seldom has a
    #: file size to record: on ext4 one journal commit fewer per round (docs/storage.md)
    wal_prealloc_bytes: int = 64 << 10
    #: a log that uses its steps up soon doubles them up to this size (the rule:
    #: ``storage/prealloc.py``); at or below ``wal_prealloc_bytes`` the step is fixed
    wal_prealloc_max_bytes: int = 1 << 20
    #: frozen in-memory segments allowed to wait for their segment file
    max_frozen: int = 2
    #: "process" (a worker process), "thread", or "inline" (tests)
    compaction: str = "process"
    #: let the merge policy start merges (and idle freezes) by itself
    auto_merge: bool = True
    #: a log holding tombstones is frozen after this many quiet seconds
    idle_freeze_seconds: float = 2.0
    #: queues this engine holds at most; creating one more is refused (``TooManyQueues``).
    #: Each queue costs a log descriptor, a descriptor per segment file and its memory
    max_queues: int = 10_000
    #: the longest a blocking call (``enqueue``, ``release`` ...) waits for its answer
    wait_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.fsync not in ("always", "interval", "never"):
            raise InvalidArgument("fsync must be always, interval or never", fsync=self.fsync)
        if self.compaction not in ("process", "thread", "inline"):
            raise InvalidArgument("compaction must be process, thread or inline")
        if not isinstance(self.max_queues, int) or self.max_queues < 1:
            raise InvalidArgument("max_queues must be a positive integer")
