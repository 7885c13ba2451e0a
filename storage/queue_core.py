"""The state of one queue, declared in one place: what ``Queue`` and each of its parts
(``queue_items``, ``queue_reads``) read and write, always under
``lock``, beside the parts it holds (``commit``: ``storage/group_commit.py``, ``files``:
``storage/segment_set.py``, ``health``: ``storage/health.py``);
and ``QueueHost``, what a queue needs from the engine that holds it.

Invariant: ``lock`` guards every field here; the engine is reached only through
``QueueHost``, never the whole ``Engine``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from dq.storage.compactor import Compactor
from dq.storage.config import EngineConfig
from dq.storage.group_commit import GroupCommit
from dq.storage.health import Health
from dq.storage.itemmeta import ItemMeta
from dq.storage.leases import Leases
from dq.storage.queue_state import QueueState
from dq.storage.rates import Rates
from dq.storage.segment_set import SegmentSet
from dq.storage.state_counts import StateCounter
from dq.storage.syncer import FsyncStats, Syncer
from dq.storage.types import QueueConfig

if TYPE_CHECKING:
    from dq.storage.queue import Queue
    from dq.storage.replication import ReplicationSink

__all__ = ["QueueCore", "QueueHost"]


class QueueHost(Protocol):
    """What a queue needs from the engine that holds it (and nothing more)."""

    config: EngineConfig
    syncer: Syncer | None
    compactor: Compactor
    fsync_stats: FsyncStats
    now: Callable[[], int]
    #: a replica group leader's replicator (None: not replicating)
    replication: ReplicationSink | None
    #: the highest lsn the sync set holds (``docs/replication.md``)
    commit_lsn: int

    def emit(self, kind: str, queue: str, ids: Sequence[int]) -> None: ...

    def merge_policy_hook(self, q: Queue) -> None: ...

    def dead_letter(self, source: Queue, entries: list[tuple[bytes, bytes, bytes]]) -> None: ...


class QueueCore:
    """The fields of a queue; the methods live in ``Queue`` and its parts."""

    def __init__(self, engine: QueueHost, name: str, directory: str, config: QueueConfig) -> None:
        self.engine = engine
        self.name = name
        self.directory = directory
        self.config = config
        self.lock = threading.RLock()
        self.leases = Leases()
        self.cursor = b""
        #: the log, the batches waiting to be durable, the barrier of unpublished ones
        self.commit = GroupCommit(name, engine)
        #: the in-memory segments, segment files and the merged view over them
        self.files = SegmentSet(name, directory)
        #: a log is open and the in-memory state mirrors the directory
        self.loaded = False
        self.next_id = 1
        self.closed = False
        #: why the queue refuses work, and when it tries to reopen
        self.health = Health(name, directory)
        self.watchers: list[Callable[[], None]] = []
        # operator features (storage/queue_state.py, itemmeta.py, rates.py)
        self.state = QueueState()
        self.meta = ItemMeta()
        self.rates = Rates()
        #: counts due and delayed items for stats; remembers the oldest due deadline
        self.state_counter = StateCounter()
        self.dead_lettered = 0
        self.lease_expired = 0
        self._timers: set[threading.Timer] = set()
