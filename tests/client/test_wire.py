"""Values survive client encoding → server decoding → server encoding → client decoding."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from dq.client import _wire
from dq.client._http import _json_bytes
from dq.client.types import NewItem, Release
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


def _compact(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


_ints = st.none() | st.integers(min_value=-(2**70), max_value=2**70)
_texts = st.text(max_size=40)  # control characters, quotes, non-BMP, lone surrogates


@given(
    st.binary(max_size=300) | st.text(max_size=100).map(lambda t: t.encode("utf-8", "replace")),
    _ints,
    _ints,
    st.none() | _texts,
)
def test_hot_bodies_are_the_bytes_the_encoder_writes(
    value: bytes, deadline: int | None, delay_ms: int | None, key: str | None
) -> None:
    """The hot calls' bodies written as text are byte for byte the compact JSON of the
    dicts (which the JSON encoder of the transport writes too)."""
    item = NewItem(value, deadline, delay_ms, key)
    expected = _compact(_wire.enqueue_body([item]))
    assert _wire.enqueue_one_json(value, deadline, delay_ms, key) == expected
    assert _wire.enqueue_json([item]) == expected == _json_bytes(_wire.enqueue_body([item]))
    assert _wire.enqueue_json([item, item]) == _compact(_wire.enqueue_body([item, item]))
    releases = [Release(abs(deadline or 0), key or ""), Release(7, "r")]
    assert _wire.release_json(releases) == _compact(_wire.release_body(releases))
    one = releases[:1]
    assert _wire.release_one_json(one[0].id, one[0].receipt) == _compact(_wire.release_body(one))
    for release in ([], one, releases):
        body = _wire.dequeue_body(3, 0, delay_ms, release)
        assert _wire.dequeue_json(3, 0, delay_ms, release) == _compact(body) == _json_bytes(body)


class _Int(int):
    pass


def test_unusual_field_types_take_the_encoders_way() -> None:
    """A field the text writer would not write as the encoder does (``True`` is ``true``
    there, a float keeps its point): ``None``, and the dict is encoded instead."""
    for odd in (True, 1.5, _Int(3)):
        assert _wire.enqueue_one_json(b"x", odd, None, None) is None
        assert _wire.enqueue_one_json(b"x", None, odd, None) is None
        assert _wire.enqueue_json([NewItem(b"x", odd)]) is None  # type: ignore[arg-type]
        assert _wire.release_one_json(odd, "r") is None
        assert _wire.release_json([Release(odd, "r")]) is None  # type: ignore[arg-type]
        assert _wire.dequeue_json(odd, 0, None, []) is None
        assert _wire.dequeue_json(1, 0, odd, []) is None
        body = _wire.dequeue_body(odd, 0, None, [])  # type: ignore[arg-type]
        assert _json_bytes(body) == _compact(body)
    assert _wire.enqueue_one_json("text", None, None, None) is None  # type: ignore[arg-type]
    assert _wire.enqueue_one_json(b"x", None, None, b"key") is None
    assert _wire.release_one_json(1, b"r") is None
