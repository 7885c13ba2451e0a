"""A follower in a process of its own, for the tests that SIGKILL it.

``python -m tests.replication.follower_proc DATA_DIR NODE LEADER_URL EPOCH [TOKEN]``
opens the engine (fsync always, as replication requires) and follows the leader with
the server's ``Follower``, as a replicated ``dq serve`` in its follower role does (the
role machine is left out: the leader is given). It prints ``FOLLOWING`` once ``follow``
has returned and ``TROUBLE <code> <message>`` for every report. SIGTERM stops the
follower, closes the engine and exits 0; SIGKILL is the crash under test.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading

from dq.server.replication.follower import Follower
from dq.storage import Engine, EngineConfig


def main() -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    data_dir, node, url, epoch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    token = sys.argv[5] if len(sys.argv) > 5 else None
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    out = threading.Lock()

    def report(code: str, message: str) -> None:
        with out:
            print("TROUBLE", code, message, flush=True)

    engine = Engine.open(data_dir, EngineConfig(fsync="always"))
    try:
        follower = Follower(
            engine, data_dir, node, token=token, report=report, wait_ms=200, backoff_s=(0.05, 0.5)
        )
        follower.follow(url, epoch)
        with out:
            print("FOLLOWING", flush=True)
        done.wait()
        follower.stop()
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
