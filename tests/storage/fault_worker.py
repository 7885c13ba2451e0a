"""A compaction worker that SIGKILLs itself at a chosen file step, once.

Run in place of ``dq.storage.worker`` (same arguments) by the fault matrix. The step is
``DQ_TEST_KILL_AT`` = ``phase:step:kind`` (see ``tests.storage.faults.phase_of`` and
``file_kind``); ``DQ_TEST_KILL_MARK`` names a file created just before dying, so the
worker the engine starts next runs normally: the helper died once, the fault cleared.
"""

from __future__ import annotations

import os
import signal

from dq.storage import fileio, worker
from tests.storage.faults import file_kind, phase_of


def main() -> None:
    phase, step, kind = os.environ["DQ_TEST_KILL_AT"].split(":")
    mark = os.environ["DQ_TEST_KILL_MARK"]

    def hook(name: str, path: str) -> None:
        matches = name == step and file_kind(path) == kind and phase_of() == phase
        if matches and not os.path.exists(mark):
            with open(mark, "w"):
                pass
            os.kill(os.getpid(), signal.SIGKILL)

    if not os.path.exists(mark):
        fileio.FAULTS.append(hook)
    worker.main()


if __name__ == "__main__":
    main()
