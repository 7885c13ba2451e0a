"""The model test under faults: ``fsync="always"``, simulated power loss, one-shot I/O errors.

The machine of ``test_model.py`` (the engine against a trivial model, through the same
random operations) runs here with ``fsync="always"`` over the power-loss layer
(``storage/powerloss.py``), with two more kinds of step:

- ``power_loss``: the machine loses power. Everything not synced is rolled back —
  sometimes leaving torn log tails and half-persisted directories — and a new engine
  starts on what is left. The model only ever changes on an acknowledgement, so every
  item, release and requeue it holds must be there.
- ``fault``: a one-shot ENOSPC, EIO or EMFILE at a drawn file step
  (``test_fault_matrix.POINTS``) during a drawn operation. The operation either
  succeeds (the model applies it) or is refused with a ``StorageError`` (the model does
  not). Then the process crashes — or the power fails — and a new engine starts: it
  must agree with the model, so a refused operation did not happen.

Throughout, ``AckCheck`` sees every acknowledgement the moment it is given and records
any batch whose log record was not yet synced.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from dq.storage import Engine, Release, Requeue, fileio
from dq.storage.errors import StorageError
from tests.storage.faults import ERRORS, AckCheck, OneShot, crash_engine
from tests.storage.test_fault_matrix import KNOWN, POINTS
from tests.storage.test_model import EngineVsModel, Q

ANSWER_S = 10.0
#: the phases the machine's operations go through (creation, closing and recovery are
#: the matrix's business)
_PHASES = {"append", "rotation", "freeze", "install", "merge"}
FAULT_POINTS = sorted(
    (point, err)
    for point, errors in POINTS.items()
    if point[0] in _PHASES
    for err in errors
    if not {("recover", "always", *point, err), ("recover", "*", *point, err)} & KNOWN.keys()
)
#: points where a process crash right after a refusal is not yet survived: those steps
#: end in a power loss only
_CRASH_KNOWN = {(key[2:5], key[5]) for key in KNOWN if key[0] == "crash"}


class EngineVsModelUnderFaults(EngineVsModel):
    FSYNC = "always"

    def open_engine(self) -> Engine:
        if not hasattr(self, "stack"):
            self.stack = ExitStack()
            self.power = self.stack.enter_context(fileio.simulate_power_loss(self.dir))
            self.acks = self.stack.enter_context(AckCheck(self.power))
        return super().open_engine()

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self.stack.close()

    def restart_after(self, *, power_loss: bool, rng: Any = None) -> None:
        crash_engine(self.engine, self.power, power_loss=power_loss, rng=rng)
        self.engine = self.open_engine()
        self.restarted()

    @rule(rng=st.randoms(use_true_random=False))
    def power_loss(self, rng: Any) -> None:
        self.restart_after(power_loss=True, rng=rng)

    # ------------------------------------------------------------------ faults

    def _live_leases(self) -> list[Any]:
        now = self.clock.now
        return sorted((i for i in self.leased() if i.lease_expires > now), key=lambda i: i.id)

    def _release(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self._live_leases()))
        fut = self.engine.release_nowait(Q, [Release(item.id, item.receipt)])
        out = fut.result(ANSWER_S)
        assert out[0].ok, out
        self.stale.append((item.id, item.receipt))
        del self.model[Q][item.id]

    def _requeue(self, data: st.DataObject) -> None:
        item = data.draw(st.sampled_from(self._live_leases()))
        now = self.clock.now
        delay = data.draw(st.integers(-2000, 5000))
        expected = self.place(Q, now + delay, item.id)
        fut = self.engine.requeue_nowait(Q, [Requeue(item.id, item.receipt, deadline=now + delay)])
        out = fut.result(ANSWER_S)
        assert out[0].ok and out[0].deadline == expected, out
        self.stale.append((item.id, item.receipt))
        item.receipt = None
        item.deadline = expected
        self.moved(Q, item)
        item.requeue_time = now
        item.durable_count = item.count

    @rule(
        data=st.data(),
        fault=st.sampled_from(FAULT_POINTS),
        op=st.sampled_from(["enqueue", "enqueue", "release", "requeue", "freeze", "merge"]),
        power_loss=st.booleans(),
    )
    def fault(
        self,
        data: st.DataObject,
        fault: tuple[tuple[str, str, str], str],
        op: str,
        power_loss: bool,
    ) -> None:
        point, err = fault
        if (point, err) in _CRASH_KNOWN:
            power_loss = True
        if op in ("release", "requeue") and not self._live_leases():
            op = "freeze"
        with OneShot(*point, ERRORS[err]).armed():
            try:
                if op == "enqueue":
                    values = data.draw(st.lists(st.binary(max_size=300), min_size=1, max_size=6))
                    self.enqueue(values, None, False)
                elif op == "release":
                    self._release(data)
                elif op == "requeue":
                    self._requeue(data)
                elif op == "freeze":
                    self.freeze()
                else:
                    try:
                        self.merge(data)
                    except OSError:
                        pass  # a merge answers no client; it failed and changed nothing
            except StorageError:
                pass  # refused: the model is unchanged, and so must the queue be
        self.restart_after(power_loss=power_loss)

    @precondition(lambda self: hasattr(self, "acks"))
    @invariant()
    def acknowledged_only_when_synced(self) -> None:
        assert not self.acks.violations, self.acks.violations[:3]


EngineVsModelUnderFaults.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineVsModelUnderFaults = EngineVsModelUnderFaults.TestCase
