"""A write load for the crash tests: prints each acknowledgement only after it returned.

Run as ``python -m tests.storage.crash_writer DATA_DIR [power]``. Threads enqueue batches
and release what they dequeue; every enqueue and release acknowledged by the engine is
printed as ``E <id>`` / ``R <id>`` (``K <id>`` for the queue nobody consumes) and flushed
(``D <id>`` before a release is requested: such an item may end either way), so the
parent knows exactly what the engine promised before it died. Keyed enqueues print
``Y <key> <id>``; a pause or resume prints ``p``/``u`` when asked and ``P``/``U`` once
answered.

With ``power``, the engine runs over the simulated power-loss layer (compaction in
threads, so every write goes through it) and ``AckCheck``. A line ``CRASH <seed>`` on
stdin makes the machine lose power: everything not synced is rolled back (torn as the
seed decides), ``V <text>`` lines report any batch acknowledged before it was synced,
``CRASHED`` follows, and the process exits at once.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import threading
from contextlib import ExitStack

from dq.storage import Engine, EngineConfig, NewItem, Release, fileio
from tests.storage.faults import AckCheck


def main() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    power_mode = len(sys.argv) > 2 and sys.argv[2] == "power"
    out_lock = threading.Lock()
    stack = ExitStack()
    if power_mode:
        power = stack.enter_context(fileio.simulate_power_loss(sys.argv[1]))
        acks = stack.enter_context(AckCheck(power))
        config = EngineConfig(fsync="always", memseg_bytes=256 * 1024, compaction="thread")
    else:
        config = EngineConfig(fsync="always", memseg_bytes=256 * 1024)
    engine = Engine.open(sys.argv[1], config)

    def say(lines: list[str]) -> None:
        with out_lock:
            sys.stdout.write("".join(lines))
            sys.stdout.flush()

    def producer(n: int) -> None:
        queue, tag = ("keep", "K") if n == 0 else ("crash", "E")  # nobody consumes "keep"
        i = 0
        while True:
            i += 1
            got = engine.enqueue(queue, [NewItem(f"{n}-{i}-{j}".encode() * 20) for j in range(20)])
            say([f"{tag} {g.id}\n" for g in got])

    def consumer() -> None:
        while True:
            items = engine.dequeue("crash", 15, 60_000) if "crash" in engine.list_queues() else []
            if items:
                # a release may become durable just before a kill, unacknowledged: in doubt
                say([f"D {d.id}\n" for d in items])
                out = engine.release("crash", [Release(d.id, d.receipt) for d in items])
                say([f"R {o.id}\n" for o in out if o.ok])

    def keyed() -> None:
        # idempotent enqueues: every batch repeats one key of the batch before it
        run = os.urandom(4).hex()
        i, last = 0, None
        while True:
            keys = [f"{run}-{i + j}" for j in range(5)]
            i += 5
            batch = [NewItem(k.encode(), key=k) for k in keys]
            if last is not None:
                batch.append(NewItem(b"again", key=last))
            got = engine.enqueue("keyed", batch)
            say([f"Y {k} {g.id}\n" for k, g in zip(keys, got, strict=False)])
            last = keys[-1]

    def toggler() -> None:
        # pause/resume: "p"/"u" before asking, "P"/"U" once answered (durable)
        engine.enqueue("toggle", [NewItem(b"x")])
        n = 0
        while True:
            n += 1
            say([f"p {n}\n"])
            engine.pause("toggle")
            say([f"P {n}\n"])
            say([f"u {n}\n"])
            engine.resume("toggle")
            say([f"U {n}\n"])

    def crasher() -> None:
        for line in sys.stdin:
            if line.startswith("CRASH"):
                out_lock.acquire()  # nothing acknowledged after this instant is reported
                power.crash(random.Random(int(line.split()[1])))
                sys.stdout.write("".join(f"V {v}\n" for v in acks.violations))
                sys.stdout.write(f"CRASHED {acks.checked}\n")
                sys.stdout.flush()
                os._exit(0)

    threads = [threading.Thread(target=producer, args=(n,), daemon=True) for n in range(3)]
    threads.append(threading.Thread(target=consumer, daemon=True))
    threads.append(threading.Thread(target=keyed, daemon=True))
    threads.append(threading.Thread(target=toggler, daemon=True))
    if power_mode:
        threads.append(threading.Thread(target=crasher, daemon=True))
    for t in threads:
        t.start()
    say(["READY\n"])
    for t in threads:
        t.join()


if __name__ == "__main__":
    main()
