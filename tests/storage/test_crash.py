"""Durability under SIGKILL and power loss: a real process dies mid-load, the directory is reopened.

Every enqueue the engine acknowledged must be there after the crash, and every
release it acknowledged must stay released. Repeated a few times, killing at
different moments (the log rotates every 256 KiB, so kills land during freezes too).

A SIGKILL keeps the page cache, so it cannot show a write acknowledged before it was
synced. The power-loss test runs the same writer over the simulated power-loss layer
(``storage/powerloss.py``): at the crash every unsynced byte and directory entry is
rolled back (tails torn as a seed decides), and the writer reports any batch it saw
acknowledged before its log record was synced.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from dq.storage import Engine, EngineConfig, NewItem

pytestmark = pytest.mark.integration  # writer processes, SIGKILLed

ROOT = Path(__file__).resolve().parents[2]


def run_and_kill(data: Path, seconds: float, power_seed: int | None = None) -> Run:
    """Start the writer, let it run ``seconds`` after it is ready, SIGKILL it — or, with
    ``power_seed``, make it lose power (and exit) instead."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.storage.crash_writer", str(data)]
        + (["power"] if power_seed is not None else []),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE if power_seed is not None else None,
        text=True,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("READY"):
                ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert ready.wait(timeout=60), "writer never became ready"
        limit = time.monotonic() + 60  # on a loaded machine the first releases can take a while
        while not {"E", "R", "K"} <= {line[0] for line in list(lines)[-200:]}:
            assert time.monotonic() < limit, "writer acknowledged no release in 60 s"
            time.sleep(0.05)
        time.sleep(seconds)
        assert proc.poll() is None, f"writer exited early: {proc.returncode}"
        if power_seed is None:
            proc.send_signal(signal.SIGKILL)
        else:
            assert proc.stdin is not None
            proc.stdin.write(f"CRASH {power_seed}\n")
            proc.stdin.flush()
        proc.wait(timeout=30)
        reader.join(timeout=10)
        if power_seed is not None:
            assert any(line.startswith("CRASHED") for line in lines), "no power loss happened"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        if proc.stdin is not None:
            proc.stdin.close()
    early = [line[2:].strip() for line in lines if line.startswith("V ")]
    assert not early, f"{len(early)} batches acknowledged before they were synced: {early[:3]}"
    sets: dict[str, set[int]] = {"E": set(), "R": set(), "D": set(), "K": set()}
    keys: dict[str, int] = {}
    toggles: list[str] = []
    for line in lines:
        if line[:2] in ("E ", "R ", "D ", "K "):
            sets[line[0]].add(int(line[2:]))
        elif line.startswith("Y "):
            _y, key, item_id = line.split()
            keys[key] = int(item_id)
        elif line[:2] in ("p ", "P ", "u ", "U "):
            toggles.append(line[0])
    return Run(sets, keys, toggles)


@dataclass
class Run:
    sets: dict[str, set[int]]
    keys: dict[str, int]  # acknowledged keyed enqueues: key -> id
    toggles: list[str]  # p/u asked, P/U answered, in order

    def __getitem__(self, kind: str) -> set[int]:
        return self.sets[kind]

    def paused_after(self) -> set[bool]:
        """The pause states a recovery may show: the last answered one, or the one asked
        after it (in flight when killed)."""
        answered = [t for t in self.toggles if t in "PU"]
        state = {answered[-1] == "P"} if answered else {False}
        if self.toggles and self.toggles[-1] in "pu":
            state.add(self.toggles[-1] == "p")
        return state


@pytest.mark.parametrize("seconds", [0.7, 1.5, 2.5])
def test_acknowledged_writes_survive_sigkill(tmp_path: Path, seconds: float) -> None:
    data = tmp_path / "data"
    runs = [run_and_kill(data, seconds) for _round in range(2)]  # crash, recover, crash again
    check_recovered(data, runs)


def test_acknowledged_writes_survive_power_loss(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random()
    seeds = [rng.randrange(1 << 30) for _ in range(2)]
    runs = [run_and_kill(data, 1.0, power_seed=seed) for seed in seeds]
    check_recovered(data, runs, f"power-loss seeds {seeds}")


def check_recovered(data: Path, runs: list[Run], context: str = "") -> None:
    """Every acknowledged write of every run is there, every acknowledged release held."""
    all_enq: set[int] = set()
    all_rel: set[int] = set()
    in_doubt: set[int] = set()
    kept: set[int] = set()
    keys: dict[str, int] = {}
    for got in runs:
        keys |= got.keys
        assert got["E"] and got["R"] and got["K"], "the writer acknowledged nothing before the kill"
        all_enq |= got["E"]
        all_rel |= got["R"]
        kept |= got["K"]
        in_doubt |= (
            got["D"] - got["R"]
        )  # release requested, not acknowledged: either outcome is fine
    last = runs[-1]
    with Engine.open(data, EngineConfig(fsync="never", compaction="inline")) as engine:
        present: set[int] = set()
        while True:
            got = engine.dequeue("crash", 1000, 60_000)
            if not got:
                break
            present.update(d.id for d in got)
        missing = (all_enq - all_rel - in_doubt) - present
        resurrected = all_rel & present
        assert not missing, (
            f"{len(missing)} acknowledged enqueues lost, e.g. {sorted(missing)[:5]} {context}"
        )
        assert not resurrected, f"{len(resurrected)} acknowledged releases came back {context}"
        # drain all of it: enqueues that became durable but were never acknowledged are
        # there too, so counting up to len(kept) would stop early
        kept_present: set[int] = set()
        while more := engine.dequeue("keep", 1000, 60_000):
            kept_present.update(d.id for d in more)
        lost = kept - kept_present
        assert not lost, f"{len(lost)} acknowledged enqueues lost from the unconsumed queue"
        # every acknowledged key is remembered: enqueuing it again writes nothing
        assert keys, "the writer acknowledged no keyed enqueue"
        names = sorted(keys)
        for i in range(0, len(names), 1000):
            chunk = names[i : i + 1000]
            again = engine.enqueue("keyed", [NewItem(b"retry", key=k) for k in chunk])
            wrong = [
                k for k, g in zip(chunk, again, strict=True) if not g.duplicate or g.id != keys[k]
            ]
            assert not wrong, f"{len(wrong)} acknowledged keys forgotten, e.g. {wrong[:3]}"
        # the last answered pause or resume holds (or the one in flight at the kill)
        assert engine.stats("toggle").paused in last.paused_after()
