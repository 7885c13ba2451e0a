"""Group commit: one thread makes every queue's log durable for all writers at once.

In ``always`` mode a write is framed into its queue's log buffer and its future is
parked; this thread takes each dirty buffer, writes it with one ``write`` and syncs
it with one ``fdatasync``, then publishes every batch that sync covered and resolves
their futures. Writers that arrive while a sync is in flight ride on the next one, so
under load one fsync serves many requests. In ``interval`` mode the thread only
syncs dirty logs every ``interval_ms``; acknowledgements do not wait for it.

A thread that serves many writers itself — the server's event loop — may commit its own
writes instead (``Syncer.commit_inline``): a write it starts with its ``InlineCommits``
(the ``commit`` argument of ``Engine.enqueue_nowait`` and the other ``*_nowait`` calls)
only notes the queue there, and the thread runs one group commit for everything it
wrote when it has nothing else ready (the loop: at its next turn, after reading every
request that arrived together).
That is Redis's ``appendfsync always`` design: no wake-up of this thread per write and
no hand-off of each answer back to the loop, which on a fast disk cost more CPU than the
fsync itself (``bench/NOTES.md``, "The event loop commits its own writes"). A slow fsync
blocks the committing thread, so while the recent average write-and-sync takes longer
than ``SLOW_COMMIT_S`` (a slow disk), that thread's writes go to this one again — unless
it serves one client alone (``InlineCommits.alone``: the loop with one connection), whom
the hand-off would only cost two thread wake-ups more per write.

Threads that each serve one writer (a ring session) lead their commits instead, as
LevelDB's ``DBImpl::Write`` does (``Syncer.commit_inline(..., led=True)``): a writer
whose write finds no round running runs it itself — a lone writer pays no hand-off to
this thread and no wake-up of it — and the writes of others that arrive meanwhile join
the leader's next round (``lead``): the leader runs rounds until no queue it was given
is left dirty, one round per queue covering every record appended to it by then.
"""

from __future__ import annotations

import logging
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from typing import Protocol

__all__ = ["FsyncStats", "InlineCommits", "SyncTarget", "Syncer"]

#: While the recent average write-and-sync of a group commit takes longer than this,
#: committing threads leave their commits to the syncer thread: the event loop must not
#: stall on a slow disk (reads would wait behind every fsync).
SLOW_COMMIT_S = 0.002
#: A writer leading group commits (``Syncer.lead``) runs at most this many passes over
#: the queues given to it — its own, then those given while it synced — and leaves what
#: is given after that to the syncer thread: it has its own client to serve.
LEAD_PASSES = 2
#: Weight of the newest group commit in that average (about the last 20 count).
_AVERAGE_WEIGHT = 0.05

log = logging.getLogger(__name__)


class SyncTarget(Protocol):
    def sync_round(self) -> float:
        """Write and sync what is buffered, publish and answer it; the seconds the
        write and sync took."""
        ...


class FsyncStats:
    """Counts and a fixed-bucket histogram of fsync latency (seconds), for /metrics."""

    BOUNDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.total_seconds = 0.0
        self.bucket_counts = [0] * (len(self.BOUNDS) + 1)

    def observe(self, seconds: float) -> None:
        with self._lock:
            self.count += 1
            self.total_seconds += seconds
            # the first bucket whose bound is not below it (past the last: the +Inf one)
            self.bucket_counts[bisect_left(self.BOUNDS, seconds)] += 1

    def snapshot(self) -> tuple[int, float, list[tuple[float, int]]]:
        """(count, sum, cumulative buckets as (upper bound, count)), Prometheus style."""
        with self._lock:
            acc, buckets = 0, []
            for bound, n in zip((*self.BOUNDS, float("inf")), self.bucket_counts, strict=True):
                acc += n
                buckets.append((bound, acc))
            return self.count, self.total_seconds, buckets


class Syncer:
    def __init__(self, mode: str, interval_ms: int) -> None:
        self.mode = mode
        self.interval = interval_ms / 1000.0
        #: the condition's lock (an ``RLock``, as a ``Condition``'s own, so its waits and
        #: notifies stay compiled calls), taken as itself where it only guards state:
        #: entering a ``Condition`` is a Python call, entering its lock a C one
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._dirty: dict[SyncTarget, None] = {}
        self._stopping = False
        self._inline: list[InlineCommits] = []
        #: queues given to writer-led commits, and whether a writer is leading them
        self._led: dict[SyncTarget, None] = {}
        self._leading = False
        #: rounds and hand-backs of committing threads that have stopped (``counts``)
        self._gone_rounds = 0
        self._gone_handed_back = 0
        #: recent average seconds of one group commit's write and sync (any thread's)
        self.average_commit_s = 0.0
        #: sync rounds (one queue's write + fsync) this thread has run
        self.rounds = 0
        self._thread = threading.Thread(target=self._run, name="dq-syncer", daemon=True)
        self._thread.start()

    def commit_inline(
        self, schedule: Callable[[Callable[[], None]], object], *, led: bool = False
    ) -> InlineCommits:
        """Let the calling thread commit its own writes (``always`` mode only).

        From now on a write this thread starts with the returned object (the ``commit``
        argument of a ``*_nowait`` call) only notes its queue (``InlineCommits.take``),
        and the first one of a round calls ``schedule(commit)``: the thread must call
        ``commit()`` soon (the event loop passes its ``call_soon``). Only calls that
        never wait for their own write take it (the ``*_nowait`` ones): a thread that
        blocked on a write it was to commit itself would wait forever, so every other
        write, and a write another thread starts, goes to the syncer thread.
        ``close()`` the result to stop. ``led``: the thread's commits go through
        ``lead`` (a thread serving one writer: concurrent writers share rounds), and
        stay with it on a slow disk (it has nothing else to do while its writes wait)."""
        inline = InlineCommits(self, schedule, led=led)
        with self._cond:
            if self.mode != "always" or self._stopping:
                raise RuntimeError("inline commits need fsync=always and a running syncer")
            self._inline.append(inline)
        return inline

    def mark_dirty(self, target: SyncTarget) -> None:
        """Have this thread write and sync ``target`` at its next round."""
        with self._lock:
            if target not in self._dirty:
                self._dirty[target] = None
                if self.mode == "always":
                    self._cond.notify()

    def lead(self, targets: list[SyncTarget]) -> int:
        """Writer-led group commit: make ``targets`` durable. If no writer is leading,
        the caller leads: it runs a round for each queue given to ``lead`` until none is
        left (those other writers give while it syncs included); else it leaves them to
        the leader, which takes them before it stops leading. Returns the rounds this
        thread ran, in at most ``LEAD_PASSES`` passes; what is given after those goes to
        the syncer thread. A queue is given only after its record was appended, and the
        leader looks again under the lock before it stops, so no write is left behind."""
        with self._lock:
            for target in targets:
                self._led[target] = None
            if self._leading:
                return 0
            self._leading = True
            batch = list(self._led)  # the first pass's, taken under the same hold
            self._led.clear()
        rounds = 0
        passes = 0
        try:
            while True:
                passes += 1
                for target in batch:
                    rounds += 1
                    try:
                        self.observe(target.sync_round())
                    except Exception:  # the target has failed its waiters; serve the others
                        log.exception("sync round failed")
                with self._lock:
                    batch = list(self._led)
                    self._led.clear()
                    if not batch or passes == LEAD_PASSES:
                        self._leading = False
                        if batch:  # others keep writing: the syncer thread takes over
                            self._dirty.update(dict.fromkeys(batch))
                            self._cond.notify()
                        return rounds
        except BaseException:  # leave what is left to this thread
            with self._lock:
                self._leading = False
                self._dirty.update(self._led)
                self._led.clear()
                self._cond.notify()
            raise

    def _run(self) -> None:
        while True:
            with self._lock:
                if self.mode == "always":
                    while not self._dirty and not self._stopping:
                        self._cond.wait()
                else:
                    self._cond.wait_for(lambda: self._stopping, timeout=self.interval)
                batch = list(self._dirty)
                self._dirty.clear()
                stopping = self._stopping
            self._sync(batch)
            # the thread then waits, maybe long: it must not hold the queues meanwhile
            # (a deleted or replaced queue would live on here until the next round)
            del batch
            if stopping:
                with self._lock:
                    if not self._dirty:
                        return

    def _sync(self, batch: list[SyncTarget]) -> None:
        for target in batch:
            self.rounds += 1
            try:
                self.observe(target.sync_round())
            except Exception:  # the target has failed its waiters; keep serving others
                log.exception("sync round failed")

    def counts(self) -> tuple[int, int, int]:
        """(sync rounds run by this thread, sync rounds run by committing threads,
        writes committing threads left to this thread because the disk was slow)."""
        with self._cond:
            inline = list(self._inline)
            gone_rounds, gone_handed_back = self._gone_rounds, self._gone_handed_back
        return (
            self.rounds,
            gone_rounds + sum(c.rounds for c in inline),
            gone_handed_back + sum(c.handed_back for c in inline),
        )

    def _forget(self, inline: InlineCommits) -> None:
        """A committing thread stopped (a ring session ended): keep its counts only."""
        with self._cond:
            if inline in self._inline:
                self._inline.remove(inline)
                self._gone_rounds += inline.rounds
                self._gone_handed_back += inline.handed_back

    def observe(self, took: float) -> None:
        """Count one group commit's write-and-sync time into the recent average (a
        race between two threads loses one sample, which an average can spare)."""
        self.average_commit_s += (took - self.average_commit_s) * _AVERAGE_WEIGHT

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            inline, self._inline = self._inline, []
            self._cond.notify_all()
        for committer in inline:  # what a committing thread noted and has not committed
            committer.close()
        deadline = time.monotonic() + 30
        self._thread.join(timeout=max(deadline - time.monotonic(), 0))


class InlineCommits:
    """The group commits of one thread that commits its own writes (``Syncer.commit_inline``).

    A write is noted here only when its caller passes this object (``commit=``) to a
    call that does not wait for the write, on the thread that made it; any other write
    goes to the syncer thread. ``close`` may come from another thread once this one has
    stopped writing (the engine closing), hence the lock.
    """

    def __init__(
        self,
        syncer: Syncer,
        schedule: Callable[[Callable[[], None]], object],
        *,
        led: bool = False,
    ) -> None:
        self._syncer = syncer
        self._schedule = schedule
        self._led = led
        #: the thread whose writes these are (it called ``Syncer.commit_inline``)
        self._thread = threading.get_ident()
        self._lock = threading.Lock()
        self._dirty: dict[SyncTarget, None] = {}
        self._scheduled = False
        self._closed = False
        #: The thread serves one client alone (its owner says so, e.g. the event loop
        #: with a single open connection): a slow commit then delays nobody else, so
        #: its writes stay on this thread whatever the disk, and the hand-off to the
        #: syncer thread (a wake-up of it, then one of this thread) is not paid.
        self.alone = False
        #: group commits run on this thread, sync rounds (one queue each) in them, and
        #: writes left to the syncer thread because the disk was slow
        self.commits = 0
        self.rounds = 0
        self.handed_back = 0

    def take(self, target: SyncTarget) -> bool:
        """Note ``target`` for this thread's next commit; False: the syncer thread's
        (closed, a slow disk while others may wait behind the commit, or called from
        another thread)."""
        if self._closed or threading.get_ident() != self._thread:
            return False
        if not self._led and not self.alone and self._syncer.average_commit_s > SLOW_COMMIT_S:
            self.handed_back += 1  # an event loop must not stall on a slow disk
            return False
        with self._lock:
            self._dirty[target] = None
            if self._scheduled:
                return True
            self._scheduled = True
        self._schedule(self.commit)
        return True

    def commit(self) -> None:
        """Write and sync every queue noted since the last commit, then publish and
        answer; one that fails has answered its own waiters (``sync_round``)."""
        with self._lock:
            if not self._dirty:
                self._scheduled = False
                return
            batch = list(self._dirty)
            self._dirty.clear()
            self._scheduled = False
        if self._led:
            self.rounds += self._syncer.lead(batch)
            self.commits += 1
            return
        observe = self._syncer.observe
        self.rounds += len(batch)
        for target in batch:
            try:
                observe(target.sync_round())
            except Exception:
                log.exception("sync round failed")
        self.commits += 1

    def close(self) -> None:
        """Stop committing on this thread; commit what is noted (from whichever thread
        closes) so no write is left waiting."""
        self._closed = True
        self.commit()
        self._syncer._forget(self)
