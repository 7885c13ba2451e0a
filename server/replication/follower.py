"""The follower side of log shipping: install the leader's snapshot, then pull and apply.

One ``Follower`` per node, driven by whoever knows the leader (the node's role machine):
``follow(url, epoch)`` makes this node follow that leader, ``stop()`` ends it. Its own
thread runs the loop, with blocking HTTP (``leader_client.py``):

1. **Fence.** The epoch is written to ``replica.json`` (``epochs.py``) before the leader
   is contacted; a lower epoch than one already followed is refused (``StaleEpoch``).
   The engine is made read-only for clients, naming the leader (``set_role``).
2. **Resync.** Every (re)join is a full copy: ``POST /v1/replica/snapshot``, unpacked
   safely and fsynced into the data directory (``snapshot_files.py``), then
   ``engine.replace_queues``. The applied lsn is then the snapshot's ``lsn``.
3. **Stream.** ``POST /v1/replica/pull`` with ``after`` = the highest lsn applied *and
   fsynced*: that is the acknowledgement the leader counts toward its commit. Frames
   must continue the lsn sequence exactly; a frame the snapshot already holds
   (``lsn <= queues[q]``) is skipped; the rest go to ``engine.apply`` and the next pull
   waits until they are durable.

Trouble is reported to the ``report(code, message)`` callback and kept in ``status()``:
``stale_leader`` (the leader is fenced), ``not_leader`` (it no longer leads),
``unreachable``, ``corruption`` (a frame failed its crc: nothing of that pull is applied),
``protocol`` (a gap in the lsns, an epoch mismatch), ``apply_failed``, ``resync_failed``,
``refused`` (any other error answer). Each is followed by a back-off (doubling, capped);
corruption, protocol and apply errors then resync, since what this node holds can no
longer be trusted to match the leader. A 409 ``resync_needed`` resyncs at once.
A watchdog thread logs (with the loop's stack) and records ``stalled`` while the loop has
waited on the engine for longer than ``stall_warn_s``: the one wait without a timeout
that logs by itself, during which the leader's writes wait for this member.

Invariant: the lsn sent as ``after`` is only ever one whose frames (and the snapshot
below them) are fsynced here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import logging
import shutil
import ssl
import sys
import tarfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from dq.server.replication.epochs import EpochFile, StaleEpoch
from dq.server.replication.leader_client import LeaderClient, LeaderRefused
from dq.server.replication.snapshot_files import (
    BadSnapshot,
    SnapshotInfo,
    remove_leftovers,
    unpack_snapshot,
)
from dq.storage.errors import CorruptionError, StorageError
from dq.storage.replication import Frame, decode_frames

__all__ = ["Follower", "FollowerEngine", "FollowerStatus", "StaleEpoch"]

logger = logging.getLogger(__name__)

State = Literal["stopped", "resyncing", "streaming"]
Report = Callable[[str, str], None]


class FollowerEngine(Protocol):
    """What the follower needs of ``dq.storage.Engine``."""

    def set_role(self, writable: bool, leader: str | None) -> None: ...
    def apply(
        self, frames: list[Frame], stopping: Callable[[], bool] | None = None
    ) -> Future[None]: ...
    def replace_queues(self, src_dir: str) -> None: ...


@dataclass(frozen=True, slots=True)
class _Target:
    url: str
    epoch: int
    node: str | None


@dataclass(slots=True)
class _Session:
    """Streaming from one leader after one snapshot."""

    target: _Target
    snapshot: SnapshotInfo
    applied: int


@dataclass(frozen=True, slots=True)
class FollowerStatus:
    state: State
    leader: _Target | None
    epoch: int
    #: the highest lsn applied and fsynced (what the last pull acknowledged)
    lsn: int
    #: the leader's commit lsn as of the last pull
    commit_lsn: int | None
    resyncs: int
    last_error: dict[str, Any] | None = field(default=None)

    def as_json(self) -> dict[str, Any]:
        leader = None
        if self.leader is not None:
            leader = {"node": self.leader.node, "url": self.leader.url}
        return {
            "state": self.state,
            "leader": leader,
            "epoch": self.epoch,
            "lsn": self.lsn,
            "commit_lsn": self.commit_lsn,
            "resyncs": self.resyncs,
            "last_error": self.last_error,
        }


class _Stopping(Exception):
    """The loop was told to stop, or to follow another leader."""


class _Resync(Exception):
    """What this node holds must be replaced by a fresh snapshot."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def _no_report(code: str, message: str) -> None:
    pass


class Follower:
    def __init__(
        self,
        engine: FollowerEngine,
        data_dir: str,
        node: str,
        *,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        report: Report = _no_report,
        wait_ms: int = 500,
        timeout_s: float = 5.0,
        backoff_s: tuple[float, float] = (0.05, 2.0),
        apply_timeout_s: float = 60.0,
        stall_warn_s: float = 5.0,
    ) -> None:
        self._engine = engine
        self._data_dir = data_dir
        self.node = node
        self._token = token
        self._ssl = ssl_context
        self._report = report
        self._wait_ms = wait_ms
        self._timeout_s = timeout_s
        self._backoff_s = backoff_s
        self._apply_timeout_s = apply_timeout_s
        self._stall_warn_s = stall_warn_s
        #: what the loop is blocked in (an apply, an install) and since when (monotonic)
        self._busy: tuple[str, float] | None = None
        self.epochs = EpochFile(data_dir)
        remove_leftovers(data_dir)
        self._cond = threading.Condition()
        self._target: _Target | None = None
        self._client: LeaderClient | None = None
        self._thread: threading.Thread | None = None
        #: bumped by ``stop``: a loop of an older generation ends at its next step
        self._generation = 0
        self._thread_generation = -1
        self._status = FollowerStatus("stopped", None, self.epochs.highest(), 0, None, 0)

    # ------------------------------------------------------------------ control

    def follow(self, url: str, epoch: int, *, leader_node: str | None = None) -> None:
        """Follow the leader at ``url`` of ``epoch`` (again: a no-op).

        The epoch is on disk before this returns, and the engine refuses client writes
        from then on. Raises ``StaleEpoch`` (nothing changes) if a higher epoch was
        followed before.
        """
        target = _Target(url, epoch, leader_node)
        with self._cond:
            if self._target == target:
                return
            if epoch < self.epochs.highest():
                raise StaleEpoch(epoch, self.epochs.highest())
            old = self._client
            if old is not None:
                # the previous leader hears nothing more (no acknowledgement) once a
                # newer epoch is on disk
                old.abort()
            self.epochs.accept(epoch)  # durable before the leader hears from us
            self._engine.set_role(False, url)
            self._target = target
            self._client = LeaderClient(
                url, token=self._token, ssl_context=self._ssl, timeout_s=self._timeout_s
            )
            self._update(state="resyncing", leader=target, epoch=epoch, commit_lsn=None)
            self._cond.notify_all()
            if (
                self._thread is None
                or not self._thread.is_alive()
                or self._thread_generation != self._generation
            ):
                self._thread_generation = self._generation
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._generation,),
                    name="dq-replica-follower",
                    daemon=True,
                )
                self._thread.start()
                threading.Thread(
                    target=self._watch, args=(self._thread,), name="dq-replica-watch", daemon=True
                ).start()
        if old is not None:
            old.close()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop following; returns once the loop has ended (or after ``timeout``), so
        no apply is in flight when the caller makes this node writable."""
        with self._cond:
            self._generation += 1
            self._target = None
            client, self._client = self._client, None
            thread = self._thread
            self._update(state="stopped")
            self._cond.notify_all()
        if client is not None:
            client.abort()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                logger.error("the follower's loop did not end within %.1f s", timeout)
        if client is not None:
            client.close()

    @property
    def following(self) -> bool:
        """True from ``follow`` until ``stop``, while the loop runs."""
        with self._cond:
            thread = self._thread
            return (
                self._target is not None
                and thread is not None
                and thread.is_alive()
                and self._thread_generation == self._generation
            )

    def status(self) -> FollowerStatus:
        with self._cond:
            return self._status

    def _update(self, **changes: Any) -> None:
        self._status = dataclasses.replace(self._status, **changes)

    # ------------------------------------------------------------------ stalls

    @contextlib.contextmanager
    def _blocked_in(self, what: str) -> Iterator[None]:
        """Mark the loop as waiting on the engine, for the watchdog."""
        self._busy = (what, time.monotonic())
        try:
            yield
        finally:
            self._busy = None

    def _watch(self, loop: threading.Thread) -> None:
        """While ``loop`` runs: warn when it has waited on the engine (an apply, an
        install) longer than ``stall_warn_s``, with its stack the first time. Nothing
        else of the loop can block without a timeout that logs, and a follower stuck
        there acknowledges nothing, so the leader's writes wait."""
        warned: tuple[str, float] | None = None
        next_warning = 0.0
        while loop.is_alive():
            time.sleep(min(1.0, self._stall_warn_s / 2))
            busy = self._busy
            if busy is None:
                continue
            what, since = busy
            waited = time.monotonic() - since
            if waited < self._stall_warn_s or (time.monotonic() < next_warning and warned == busy):
                continue
            stack = ""
            if warned != busy:
                frame = sys._current_frames().get(loop.ident or -1)
                if frame is not None:
                    stack = "\n" + "".join(traceback.format_stack(frame))
            warned, next_warning = busy, time.monotonic() + self._stall_warn_s
            message = f"{what}: waiting for {waited:.1f} s{stack}"
            logger.warning("replication stalled: %s", message)
            with self._cond:
                if self._target is not None:
                    error = {
                        "code": "stalled",
                        "message": f"{what}: waiting for {waited:.1f} s",
                        "at": time.time(),
                    }
                    self._update(last_error=error)

    # ------------------------------------------------------------------ the loop

    def _current(self, target: _Target) -> LeaderClient:
        """The client for ``target``; raises ``_Stopping`` once it is no longer current."""
        with self._cond:
            if self._target is not target or self._client is None:
                raise _Stopping
            return self._client

    def _run(self, generation: int) -> None:
        try:
            self._loop(generation)
        except BaseException:
            # never expected (every step's errors are caught below); but a loop that ends
            # while still following would leave this member silent, so say so loudly
            logger.exception("the follower's loop ended unexpectedly")
            with self._cond:
                if self._generation == generation:
                    self._update(
                        state="stopped",
                        last_error={
                            "code": "error",
                            "message": "the follower's loop ended unexpectedly (see the log)",
                            "at": time.time(),
                        },
                    )

    def _loop(self, generation: int) -> None:
        session: _Session | None = None
        backoff = self._backoff_s[0]
        while True:
            with self._cond:
                if self._generation != generation or self._target is None:
                    return
                target = self._target
            try:
                if session is None or session.target is not target:
                    session = None
                    session = self._resync(target)
                self._pull_once(session)
                backoff = self._backoff_s[0]
                continue
            except _Stopping:
                continue
            except _Resync as exc:
                session = None
                if exc.code == "resync_needed" or not self._is_current(target):
                    continue  # asked for by the leader, or stopping: no trouble, no wait
                self._trouble(target, exc.code, str(exc))
            except Exception as exc:
                if not self._is_current(target):
                    continue  # a request cut short by stop() or by a new leader
                self._trouble(target, *self._classify(exc))
            self._pause(target, backoff)
            backoff = min(backoff * 2, self._backoff_s[1])

    def _is_current(self, target: _Target) -> bool:
        with self._cond:
            return self._target is target

    def _pause(self, target: _Target, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._target is not target, timeout=seconds)

    @staticmethod
    def _classify(exc: BaseException) -> tuple[str, str]:
        if isinstance(exc, LeaderRefused):
            if exc.code in ("stale_leader", "not_leader"):
                return exc.code, str(exc) + (f" (leader: {exc.leader})" if exc.leader else "")
            return "refused", str(exc)
        if isinstance(exc, OSError | http.client.HTTPException):
            return "unreachable", f"{type(exc).__name__}: {exc}"
        return "error", f"{type(exc).__name__}: {exc}"

    def _trouble(self, target: _Target, code: str, message: str) -> None:
        if code in ("corruption", "protocol"):
            logger.error("replication from %s refused: %s: %s", target.url, code, message)
        else:
            logger.warning("replication from %s: %s: %s", target.url, code, message)
        with self._cond:
            if self._target is target:
                error = {"code": code, "message": message, "at": time.time()}
                self._update(last_error=error)
        try:
            self._report(code, message)
        except Exception:
            logger.exception("the follower's report callback failed")

    def _resync(self, target: _Target) -> _Session:
        with self._cond:
            if self._target is target:
                self._update(state="resyncing")
        client = self._current(target)

        def check() -> None:
            if not self._is_current(target):
                raise _Stopping

        try:
            with client.snapshot(self.node, target.epoch) as stream:
                dest, info = unpack_snapshot(stream, self._data_dir, check)
        except (BadSnapshot, tarfile.TarError, StorageError) as exc:
            raise _Resync("resync_failed", f"{type(exc).__name__}: {exc}") from exc
        except OSError as exc:
            if exc.filename is None:
                raise  # the network: reported as unreachable
            raise _Resync("resync_failed", f"writing the snapshot: {exc}") from exc
        try:
            if info.epoch != target.epoch:
                code = "stale_leader" if info.epoch < target.epoch else "protocol"
                raise _Resync(code, f"snapshot of epoch {info.epoch}, following {target.epoch}")
            check()
            with self._blocked_in(f"installing the snapshot (lsn {info.lsn})"):
                try:
                    self._engine.replace_queues(dest)
                except Exception as exc:  # this member's disk, not the network
                    raise _Resync("resync_failed", f"installing: {exc!r}") from exc
        finally:
            shutil.rmtree(dest, ignore_errors=True)
        logger.info(
            "installed the snapshot of %s (epoch %d, lsn %d, %d queues)",
            target.url, info.epoch, info.lsn, len(info.queues),
        )  # fmt: skip
        with self._cond:
            resyncs = self._status.resyncs + 1
            if self._target is target:
                self._update(state="streaming", lsn=info.lsn, resyncs=resyncs)
            else:
                self._update(resyncs=resyncs)
        return _Session(target, info, info.lsn)

    def _pull_once(self, session: _Session) -> None:
        target = session.target
        client = self._current(target)
        try:
            pulled = client.pull(self.node, target.epoch, session.applied, self._wait_ms)
        except LeaderRefused as exc:
            if exc.status == 409 and exc.code == "resync_needed":
                raise _Resync("resync_needed", str(exc)) from exc
            raise
        if pulled.epoch is not None and pulled.epoch != target.epoch:
            raise _Resync("protocol", f"leader answered for epoch {pulled.epoch}")
        frames = self._decode(pulled.body, session.applied)
        if frames:
            fresh = [f for f in frames if not session.snapshot.covers(f.queue, f.lsn)]
            if fresh:
                self._apply(fresh, lambda: not self._is_current(target))
            session.applied = frames[-1].lsn
        with self._cond:
            if self._target is target:
                self._update(lsn=session.applied, commit_lsn=pulled.commit_lsn)

    @staticmethod
    def _decode(body: bytes, after: int) -> list[Frame]:
        if not body:
            return []
        try:
            frames = decode_frames(body)
        except CorruptionError as exc:
            raise _Resync("corruption", f"{exc} (after lsn {after}; nothing applied)") from exc
        expected = after + 1
        for frame in frames:
            if frame.lsn != expected:
                raise _Resync("protocol", f"frame lsn {frame.lsn} where {expected} was due")
            expected += 1
        return frames

    def _apply(self, frames: list[Frame], stopping: Callable[[], bool]) -> None:
        """Apply ``frames`` and wait until they are durable. A queue whose writes are
        stalled here waits before its next record (``ReplicaEngine.apply``), so this
        member acknowledges nothing more meanwhile; ``stopping`` cuts that wait short."""
        queues = sorted({f.queue for f in frames})
        what = f"applying lsn {frames[0].lsn}..{frames[-1].lsn} to {', '.join(queues)}"
        try:
            with self._blocked_in(what):
                self._engine.apply(frames, stopping).result(timeout=self._apply_timeout_s)
        except Exception as exc:
            raise _Resync("apply_failed", f"{type(exc).__name__}: {exc}") from exc
