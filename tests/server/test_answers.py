"""The hand-formatted dequeue and enqueue bodies are valid JSON that matches
``DequeueResponse`` and ``EnqueueResponse``."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dq.server.answers import dequeued_json, enqueued_json
from dq.server.schemas import DequeueResponse, EnqueueResponse, decode_value
from dq.storage.types import Delivery, Enqueued, ItemStats

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


@given(
    st.lists(_deliveries, max_size=5),
    st.sampled_from([None, "base64", "utf-8"]),
    st.booleans(),
)
def test_round_trip(got: list[Delivery], encoding: str | None, exists: bool) -> None:
    doc = json.loads(dequeued_json(got, encoding, queue_exists=exists))  # type: ignore[arg-type]
    assert DequeueResponse.model_validate(doc).queue_exists is exists
    assert ("queue_exists" in doc) is not exists  # said only when false
    assert [i["id"] for i in doc["items"]] == [d.id for d in got]
    for item, d in zip(doc["items"], got, strict=True):
        assert item["receipt"] == d.receipt and item["lease_expires"] == d.lease_expires
        assert decode_value(item["value"], item["encoding"]) == d.value
        assert item["stats"]["dequeue_count"] == d.stats.dequeue_count
        if encoding == "base64":
            assert item["encoding"] == "base64"


@given(st.lists(st.builds(Enqueued, _ids, _times, st.booleans()), max_size=5))
def test_enqueued_is_what_pydantic_writes(done: list[Enqueued]) -> None:
    body = enqueued_json(done)
    model = EnqueueResponse.model_validate(
        {"items": [{"id": e.id, "deadline": e.deadline, "duplicate": e.duplicate} for e in done]}
    )
    # ``replaced`` is said only when true: without it, the bytes are pydantic's
    assert body == model.model_dump_json(exclude={"items": {"__all__": {"replaced"}}}).encode()


@given(st.lists(st.builds(Enqueued, _ids, _times, st.just(False), st.booleans()), max_size=5))
def test_a_replaced_item_says_so(done: list[Enqueued]) -> None:
    doc = json.loads(enqueued_json(done))
    model = EnqueueResponse.model_validate(doc)
    assert [i.replaced for i in model.items] == [e.replaced for e in done]
    assert [("replaced" in i) for i in doc["items"]] == [e.replaced for e in done]
