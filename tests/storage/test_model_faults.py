"""The model test under faults: ``fsync="always"`` and simulated power loss.

The machine of ``test_model.py`` (the engine against a trivial model, through the same
random operations) runs here with ``fsync="always"`` over the power-loss layer
(``storage/powerloss.py``), with one more kind of step:

- ``power_loss``: the machine loses power. Everything not synced is rolled back —
  sometimes leaving torn log tails and half-persisted directories — and a new engine
  starts on what is left. The model only ever changes on an acknowledgement, so every
  item, release and requeue it holds must be there.

Throughout, ``AckCheck`` sees every acknowledgement the moment it is given and records
any batch whose log record was not yet synced.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

from dq.storage import Engine, fileio
from tests.storage.faults import AckCheck, crash_engine
from tests.storage.test_model import EngineVsModel


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

    @precondition(lambda self: hasattr(self, "acks"))
    @invariant()
    def acknowledged_only_when_synced(self) -> None:
        assert not self.acks.violations, self.acks.violations[:3]


EngineVsModelUnderFaults.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEngineVsModelUnderFaults = EngineVsModelUnderFaults.TestCase
