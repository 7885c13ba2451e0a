"""What the workload sends and how a delivery is read back."""

from __future__ import annotations

from dq.client.errors import NotFound, ServerError, TransportError, Unavailable
from tests.jepsen.workload import outcome_of, payload, value_of


def test_a_padded_payload_is_checked_byte_for_byte() -> None:
    data = payload("p0-17", 4096)
    assert len(data) == 4096 and value_of(data, 4096) == "p0-17"
    assert value_of(data[:-1] + b"?", 4096) == "corrupt:p0-17"
    assert value_of(data[:100], 4096) == "corrupt:p0-17"  # cut short
    assert payload("p0-17", 0) == b"p0-17" and value_of(b"p0-17", 0) == "p0-17"


def test_only_refusals_that_wrote_nothing_count_as_failed() -> None:
    assert outcome_of(ServerError(421, "not_leader", "")) == "fail"
    assert outcome_of(Unavailable(503, "no_leader", "")) == "fail"
    assert outcome_of(Unavailable(503, "replication_stalled", "")) == "fail"
    assert outcome_of(NotFound(404, "queue_not_found", "")) == "fail"
    assert outcome_of(Unavailable(503, "replication_timeout", "")) == "unknown"
    assert outcome_of(Unavailable(503, "queue_failed", "")) == "unknown"
    assert outcome_of(TransportError("no answer")) == "unknown"
