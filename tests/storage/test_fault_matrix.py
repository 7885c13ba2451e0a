"""Fault-injection matrix: every file step, each fault, each fsync mode.

Each case runs one scripted workload — enqueues that rotate the log, dequeues, releases,
requeues, freezes, merges, a restart — with a one-shot fault at the first file step that
matches (phase, step, file kind), e.g. ENOSPC on the first write of a segment file during
a freeze. The fault then clears. Each case checks:

1. every call answers within ``ANSWER_S`` (no request hangs);
2. every failure is a ``StorageError`` (HTTP 503/507), never a bare ``OSError`` (a 500);
3. once the fault has cleared, the engine recovers by itself: an enqueue succeeds again
   and every frozen log gets its segment file;
4. after a process crash and restart: every acknowledged, unreleased item is there
   exactly once, with its value and deadline; no released item came back; nothing a
   refused operation carried is there (a refused operation did not happen);
5. in ``always`` mode, every batch was acknowledged only once its log record was synced
   (``AckCheck`` against the power-loss layer's view of the disk).

"Helper killed" cases run the compaction in its worker process and SIGKILL that process
at a file step of a freeze or merge (``tests/storage/fault_worker.py``).

``test_matrix_covers_every_step`` records every step the workload makes in each mode and
fails when one is missing from ``POINTS`` (a new file step needs its row here) or when a
row is never reached (its cases would test nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from dq.storage import Engine, EngineConfig, NewItem, Release, Requeue, fileio
from dq.storage.compactor import _WorkerProcess
from dq.storage.errors import StorageError
from dq.storage.powerloss import PowerLoss
from tests.storage.conftest import FakeClock
from tests.storage.faults import ERRORS, AckCheck, OneShot, Recorder, crash_engine

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
Q = "jobs"
MODES = ("always", "interval", "never")
ANSWER_S = 10.0
RECOVER_S = 4.0

# (phase, step, file kind) -> the errors injected there. Phases are named after what the
# engine is doing (tests/storage/faults.py, ``phase_of``).
_W = ("ENOSPC", "EIO")
_OPEN = ("EMFILE", "EIO")
_DIR = ("EIO", "EMFILE")  # fsync_dir opens the directory
_CREATE = ("EMFILE", "ENOSPC")
POINTS: dict[tuple[str, str, str], tuple[str, ...]] = {
    ("create", "create", "config"): _CREATE,
    ("create", "write", "config"): _W,
    ("create", "fsync", "log.tmp"): _W,
    ("create", "fsync_dir", "dir"): _DIR,
    ("append", "allocate", "log"): _W,
    ("append", "write", "log"): _W,
    ("append", "fsync", "log"): _W,
    ("rotation", "create", "log.tmp"): _CREATE,
    ("rotation", "write", "log.tmp"): _W,
    ("rotation", "fsync", "log.tmp"): _W,
    ("rotation", "rename", "log"): _W,
    ("rotation", "fsync_dir", "dir"): _DIR,
    ("rotation", "open", "log"): _OPEN,
    ("rotation", "fsync", "log"): _W,
    ("rotation", "truncate", "log"): _W,
    ("rotation", "rename", "log_ro"): _W,
    ("freeze", "create", "seg.tmp"): _CREATE,
    ("freeze", "write", "seg.tmp"): _W,
    ("freeze", "fsync", "seg.tmp"): _W,
    ("freeze", "rename", "seg"): _W,
    ("freeze", "fsync_dir", "dir"): _DIR,
    ("install", "unlink", "log_ro"): ("EIO",),
    ("install", "fsync_dir", "dir"): _DIR,
    ("merge", "create", "seg.tmp"): _CREATE,
    ("merge", "write", "seg.tmp"): _W,
    ("merge", "fsync", "seg.tmp"): _W,
    ("merge", "rename", "seg"): _W,
    ("merge", "fsync_dir", "dir"): _DIR,
    ("install", "unlink", "seg"): ("EIO",),
    ("close", "truncate", "log"): _W,
    ("close", "fsync", "log"): _W,
    ("recovery", "rename", "log_ro"): _W,
    ("recovery", "fsync_dir", "dir"): _DIR,
    ("recovery", "create", "log.tmp"): _CREATE,
    ("recovery", "write", "log.tmp"): _W,
    ("recovery", "open", "log"): _OPEN,
}
#: steps of a mode that has no sync on that path
_NOT_IN = {
    "never": {("append", "fsync", "log"), ("rotation", "fsync", "log"), ("close", "fsync", "log")}
}
#: steps the workload makes that need no fault of their own: the rest of a step already
#: in the table (the same file, the next line of code), or a marker file
_COVERED_ELSEWHERE = {
    ("create", "write", "log.tmp"),
    ("create", "create", "log.tmp"),
    ("create", "rename", "log"),
    ("create", "rename", "config"),
    ("create", "fsync", "config"),
    ("create", "open", "log"),
    ("recovery", "fsync", "log.tmp"),
    ("recovery", "rename", "log"),
    ("freeze", "unlink", "seg.tmp"),
    ("close", "unlink", "other"),
}
#: where the helper (compaction worker) is killed, and in which modes (the worker's own
#: steps do not depend on the mode, and neither does the engine's reaction to its death)
KILL_POINTS = (
    ("freeze", "write", "seg.tmp", ("always", "interval")),
    ("freeze", "rename", "seg", ("always",)),
    ("merge", "write", "seg.tmp", ("always",)),
)

#: cases that fail until the engine's fix lands:
#: (then, mode or "*", phase, step, kind, error) -> why
KNOWN: dict[tuple[str, ...], str] = {}


def _param(then: str, mode: str, point: tuple[str, str, str], err: str) -> Any:
    why = KNOWN.get((then, mode, *point, err)) or KNOWN.get((then, "*", *point, err))
    marks = [pytest.mark.xfail(strict=True, reason=why)] if why else []
    if err == "killed":  # the compaction runs in its worker process, which is killed
        marks.append(pytest.mark.integration)
    name = f"{mode}-{'-'.join(point)}-{err}" + ("-crash" if then == "crash" else "")
    return pytest.param(mode, point, err, then, marks=marks, id=name)


def _cases() -> Iterator[Any]:
    """Every (point, error) in every mode, then recovery; in ``always`` also a crash
    right after the first refusal (the refused operation must not come back)."""
    for mode in MODES:
        for point, errors in POINTS.items():
            if point in _NOT_IN.get(mode, set()):
                continue
            for err in errors:
                yield _param("recover", mode, point, err)
                if mode == "always" and point[0] not in ("close", "recovery"):
                    yield _param("crash", mode, point, err)
        for phase, step, kind, modes in KILL_POINTS:
            if mode in modes:
                yield _param("recover", mode, (phase, step, kind), "killed")


class _Stop(Exception):
    """Ends the workload at the first refusal (the crash comes right after it)."""


# ---------------------------------------------------------------------------- the model


@dataclass
class Ledger:
    """What the engine acknowledged: the items that must be there after a restart."""

    live: dict[int, tuple[bytes, int]] = field(default_factory=dict)  # id -> value, deadline
    released: set[int] = field(default_factory=set)
    leased: dict[int, str] = field(default_factory=dict)  # id -> receipt
    refused: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


class Runner:
    """Drives one engine through the workload, keeping the ledger; every wait is bounded."""

    def __init__(self, path: Path, config: EngineConfig, power: PowerLoss) -> None:
        self.path = path
        self.config = config
        self.power = power
        self.clock = FakeClock()
        self.ledger = Ledger()
        self.n = 0
        self.stop_on_refusal = False
        self.engine: Engine | None = Engine.open(path, config, clock=self.clock)

    @property
    def e(self) -> Engine:
        assert self.engine is not None
        return self.engine

    def _answer(self, what: str, fut: Future[Any]) -> Any:
        try:
            return fut.result(timeout=ANSWER_S)
        except TimeoutError:
            pytest.fail(f"{what} got no answer in {ANSWER_S} s")

    def _refused(self, what: str, exc: BaseException) -> None:
        self.ledger.refused.append(f"{what}: {exc!r}")
        if not isinstance(exc, StorageError):
            self.ledger.unexpected.append(f"{what}: {exc!r}")
        if self.stop_on_refusal:
            raise _Stop(what) from exc

    def attempt(self, what: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except (pytest.fail.Exception, _Stop):
            raise
        except Exception as exc:
            self._refused(what, exc)
            return None

    def enqueue(self, count: int, delay_ms: int = 0) -> bool:
        values = []
        for _ in range(count):
            self.n += 1
            values.append(f"item-{self.n}:".encode().ljust(200, b"."))
        items = [NewItem(v, delay_ms=delay_ms) for v in values]
        got = self.attempt(
            "enqueue", lambda: self._answer("enqueue", self.e.enqueue_nowait(Q, items))
        )
        if got is None:
            return False
        for g, v in zip(got, values, strict=True):
            self.ledger.live[g.id] = (v, g.deadline)
        return True

    def dequeue(self, count: int) -> None:
        got = self.attempt("dequeue", lambda: self.e.dequeue(Q, count, 600_000))
        for d in got or []:
            assert d.id not in self.ledger.released, f"released item {d.id} handed out again"
            assert d.id in self.ledger.live, f"dequeue handed out {d.id}, never acknowledged"
            assert d.value == self.ledger.live[d.id][0]
            self.ledger.leased[d.id] = d.receipt

    def release(self, count: int) -> None:
        ids = sorted(self.ledger.leased)[:count]
        batch = [Release(i, self.ledger.leased.pop(i)) for i in ids]
        out = self.attempt(
            "release", lambda: self._answer("release", self.e.release_nowait(Q, batch))
        )
        for o in out or []:
            if o.ok:
                self.ledger.live.pop(o.id)
                self.ledger.released.add(o.id)

    def requeue(self, count: int) -> None:
        ids = sorted(self.ledger.leased)[:count]
        batch = [Requeue(i, self.ledger.leased.pop(i), delay_ms=500) for i in ids]
        out = self.attempt(
            "requeue", lambda: self._answer("requeue", self.e.requeue_nowait(Q, batch))
        )
        for o in out or []:
            if o.ok:
                value, _ = self.ledger.live[o.id]
                self.ledger.live[o.id] = (value, o.deadline)

    def merge(self) -> None:
        """A merge of every segment, as the merge policy starts one. It answers no
        client, so its error need not be a ``StorageError``; it must end, though."""
        try:
            q = self.e.queue(Q)
            fut = q.merge(0, len(q.segments), wait=False)
            if fut is not None:
                self._answer("merge", fut)
        except (pytest.fail.Exception, _Stop):
            raise
        except Exception as exc:
            self._refused(
                "merge", exc if isinstance(exc, StorageError) else StorageError(repr(exc))
            )

    def restart(self) -> None:
        """A clean stop and start (the recovery steps run here)."""
        self.attempt("close", self.e.close)
        self.engine = None
        try:
            self.engine = Engine.open(self.path, self.config, clock=self.clock)
        except Exception as exc:  # refusing to start is loud enough: a clear error, no damage
            self.ledger.refused.append(f"open: {exc!r}")
            self.engine = Engine.open(self.path, self.config, clock=self.clock)  # fault cleared
        self.ledger.leased.clear()

    def recovers(self) -> None:
        """Once the fault has cleared the engine must serve again by itself."""
        give_up = time.monotonic() + RECOVER_S
        errors = len(self.ledger.refused)
        while not self.enqueue(1):
            if time.monotonic() > give_up:
                pytest.fail(
                    f"the engine did not recover in {RECOVER_S} s after the fault cleared: "
                    f"{self.ledger.refused[errors:][-1]}"
                )
            time.sleep(0.05)
        q = self.e.queue(Q)
        while q.files.frozen:
            if time.monotonic() > give_up:
                pytest.fail(f"{len(q.files.frozen)} frozen log(s) never got their segment file")
            time.sleep(0.02)

    def crash_and_check(self) -> None:
        """Process crash, restart, and the invariant over everything that was answered."""
        crash_engine(self.e, self.power, power_loss=False)
        self.engine = Engine.open(self.path, self.config, clock=self.clock)
        self.clock.advance(86_400_000)
        seen: list[int] = []
        found: dict[int, tuple[bytes, int]] = {}
        while Q in self.e.list_queues():  # a refused creation leaves no queue
            got = self.e.dequeue(Q, 1000, 600_000)
            if not got:
                break
            for d in got:
                seen.append(d.id)
                found[d.id] = (d.value, d.deadline)
        led = self.ledger
        twice = sorted(i for i in set(seen) if seen.count(i) > 1)
        missing = sorted(set(led.live) - set(found))
        back = sorted(set(found) & led.released)
        stray = sorted(set(found) - set(led.live) - led.released)
        changed = sorted(i for i in set(found) & set(led.live) if found[i] != led.live[i])
        problems = []
        if missing:
            problems.append(f"{len(missing)} acknowledged items lost, e.g. {missing[:5]}")
        if twice:
            problems.append(f"items delivered twice: {twice[:5]}")
        if back:
            problems.append(f"released items came back: {back[:5]}")
        if stray:
            problems.append(f"items of refused operations are there: {stray[:5]}")
        if changed:
            i = changed[0]
            problems.append(f"item {i} changed: {found[i]!r:.80} != {led.live[i]!r:.80}")
        assert not problems, "; ".join(problems) + f" (refused: {led.refused[:3]})"
        assert not led.unexpected, f"errors that are not StorageError: {led.unexpected}"


def workload(r: Runner) -> None:
    """Enqueues that rotate the 2 KiB logs (each rotation freezes the old log into a
    segment file), deliveries, releases and requeues, merges, a restart in the middle.
    Deterministic: the same steps in the same order every run."""
    for _ in range(6):
        r.enqueue(3)
    r.dequeue(8)
    r.release(3)
    r.requeue(2)
    for _ in range(4):
        r.enqueue(3)
    r.merge()
    r.restart()
    for _ in range(5):
        r.enqueue(3, delay_ms=100)
    r.dequeue(6)
    r.release(4)
    for _ in range(4):
        r.enqueue(3)
    r.merge()
    r.enqueue(2)


def _config(mode: str, compaction: str = "inline") -> EngineConfig:
    return EngineConfig(
        fsync=mode,  # type: ignore[arg-type]
        compaction=compaction,
        auto_merge=False,
        memseg_bytes=2048,
        max_frozen=2,
        fsync_interval_ms=5,
    )


def _killing_spawn(spec: str, mark: Path) -> Callable[[_WorkerProcess], Any]:
    def spawn(self: _WorkerProcess) -> subprocess.Popen[bytes]:
        env = {**os.environ, "DQ_TEST_KILL_AT": spec, "DQ_TEST_KILL_MARK": str(mark)}
        return subprocess.Popen(
            [sys.executable, "-m", "tests.storage.fault_worker", str(os.getpid()), str(self.nice)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
            cwd=ROOT,
            env=env,
        )

    return spawn


@pytest.mark.parametrize(("mode", "point", "err", "then"), list(_cases()))
def test_fault(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    point: tuple[str, str, str],
    err: str,
    then: str,
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    killed = err == "killed"
    mark = tmp_path / "killed"
    if killed:
        monkeypatch.setattr(_WorkerProcess, "_spawn", _killing_spawn(":".join(point), mark))
    config = _config(mode, "process" if killed else "inline")
    shot = OneShot(*point, ERRORS.get(err, 0))
    with fileio.simulate_power_loss(str(data)) as power, AckCheck(power) as acks:
        r = Runner(data, config, power)
        r.stop_on_refusal = then == "crash"
        try:
            try:
                if killed:
                    workload(r)
                    assert mark.exists(), f"the helper never reached {point}"
                else:
                    with shot.armed():
                        workload(r)
            except _Stop:
                pass
            assert killed or shot.fired, f"the workload never reached {point}"
            r.stop_on_refusal = False
            if then == "recover":
                r.recovers()
            r.crash_and_check()
        finally:
            if r.engine is not None:
                r.engine.close()
        assert not acks.violations, acks.violations[:3]
        if mode == "always" and then == "recover":
            assert acks.checked > 0


@pytest.mark.parametrize("mode", MODES)
def test_matrix_covers_every_step(tmp_path: Path, mode: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    rec = Recorder()
    with fileio.simulate_power_loss(str(data)) as power:
        r = Runner(data, _config(mode), power)
        fileio.FAULTS.append(rec)
        try:
            workload(r)
        finally:
            fileio.FAULTS.remove(rec)
            r.e.close()
    assert not r.ledger.refused, r.ledger.refused
    wanted = set(POINTS) - _NOT_IN.get(mode, set())
    unlisted = rec.seen - wanted - _COVERED_ELSEWHERE
    assert not unlisted, f"steps without a row in POINTS: {sorted(unlisted)}"
    unreached = wanted - rec.seen
    assert not unreached, f"rows of POINTS the workload never reaches: {sorted(unreached)}"
