"""``Health``, why a queue refuses work, on its own: a failure refuses work until the
queue reopens, a fault that does not clear backs the reopening off, damage is for good.
(What failing means for the rest of the queue is ``test_faults_sync.py``'s.)"""

from __future__ import annotations

import time

from dq.storage.errors import CorruptionError, EngineUnavailable, QueueDamaged, WriteStall
from dq.storage.health import Health, backoff


def test_a_failure_refuses_work_until_the_queue_reopens() -> None:
    h = Health("q", "/data/queues/q")
    assert h.failed is None and not h.recovery_due()
    cause = OSError(5, "Input/output error")
    h.fail(cause, "syncing the log")
    assert isinstance(h.failed, EngineUnavailable) and h.failed.__cause__ is cause
    assert "syncing the log" in h.failed.message and h.io_errors == 1
    first = h.failed
    h.fail(OSError(28, "No space left on device"), "writing the log")
    assert h.failed is first and h.io_errors == 1  # the first failure is the one told
    assert h.recovery_due()  # a first failure is retried at once
    h.reopened()
    assert h.failed is None and h.recoveries == 1


def test_a_fault_that_does_not_clear_backs_the_reopening_off() -> None:
    h = Health("q", "/d")
    h.fail(OSError(28, "full"), "writing the log")
    h.reopened()
    h.fail(OSError(28, "full"), "writing the log")  # again right after reopening
    assert not h.recovery_due()  # 50 ms first
    time.sleep(0.06)
    assert h.recovery_due()
    h.reopen_failed(OSError(28, "full"))  # 100 ms now
    time.sleep(0.06)
    assert not h.recovery_due()
    assert [round(d, 2) for d in (backoff(0), backoff(0.05), backoff(4))] == [0.05, 0.1, 5.0]


def test_damage_is_for_good() -> None:
    h = Health("q", "/d")
    h.quarantine(CorruptionError("bad block", file="/d/0000000001-0000000001.seg", offset=77))
    assert h.quarantined and isinstance(h.failed, QueueDamaged)
    assert h.failed.context["file"].endswith(".seg") and h.failed.context["offset"] == 77
    assert not h.recovery_due()
    h.quarantine(CorruptionError("torn", offset=3))  # no file named: the queue's directory
    assert h.failed.context["file"] == "/d"


def test_a_refused_write_hears_the_storage_error_itself_or_what_failed() -> None:
    h = Health("q", "/d")
    stall = WriteStall("stalled")
    assert h.refusal(stall, "writing the log") is stall
    other = h.refusal(OSError(28, "No space left on device"), "writing the log")
    assert isinstance(other, EngineUnavailable)
    assert other.message.startswith("writing the log failed:")
