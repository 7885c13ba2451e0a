"""Values survive client encoding → server decoding → server encoding → client decoding."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dq.client import _wire
from dq.client.types import NewItem
from dq.server.schemas import EnqueueRequest, encode_value, to_new_items


@given(st.binary(max_size=300) | st.text(max_size=100).map(str.encode))
def test_value_round_trip(value: bytes) -> None:
    wire = json.loads(json.dumps(_wire.enqueue_body([NewItem(value, delay_ms=5)])))
    (stored,) = to_new_items(EnqueueRequest.model_validate(wire).items)
    assert stored.value == value and stored.delay_ms == 5 and stored.deadline is None
    for forced in (None, "base64"):
        text, encoding = encode_value(stored.value, forced)  # type: ignore[arg-type]
        doc = {
            "items": [
                {"id": 1, "receipt": "r", "value": text, "encoding": encoding, "deadline": 0,
                 "stats": {"enqueue_time": 0, "requeue_time": 0, "dequeue_count": 1},
                 "lease_expires": 0}
            ]
        }  # fmt: skip
        (item,) = _wire.parse_items(json.loads(json.dumps(doc)))
        assert item.value == value
