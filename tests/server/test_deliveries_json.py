"""The hand-formatted dequeue body is valid JSON that matches ``DequeueResponse``."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dq.server.routers.items import deliveries_json
from dq.server.schemas import DequeueResponse, decode_value
from dq.storage.types import Delivery, ItemStats

_ids = st.integers(min_value=0, max_value=(1 << 64) - 1)
_times = st.integers(min_value=0, max_value=(1 << 48) - 1)
_deliveries = st.builds(
    Delivery,
    id=_ids,
    receipt=st.text(min_size=1, max_size=40),
    value=st.binary(max_size=64) | st.text(max_size=64).map(str.encode),
    deadline=_times,
    stats=st.builds(ItemStats, _times, _times, st.integers(0, 0xFFFFFFFF)),
    lease_expires=_times,
)


@given(st.lists(_deliveries, max_size=5), st.sampled_from([None, "base64", "utf-8"]))
def test_round_trip(got: list[Delivery], encoding: str | None) -> None:
    doc = json.loads(deliveries_json(got, encoding))  # type: ignore[arg-type]
    DequeueResponse.model_validate(doc)
    assert [i["id"] for i in doc["items"]] == [d.id for d in got]
    for item, d in zip(doc["items"], got, strict=True):
        assert item["receipt"] == d.receipt and item["lease_expires"] == d.lease_expires
        assert decode_value(item["value"], item["encoding"]) == d.value
        assert item["stats"]["dequeue_count"] == d.stats.dequeue_count
        if encoding == "base64":
            assert item["encoding"] == "base64"
