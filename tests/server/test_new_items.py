"""``to_new_items`` builds the same ``NewItem`` its constructor would (it writes the
frozen dataclass's slots directly, for speed), and refuses what the route refuses."""

from __future__ import annotations

import dataclasses

import pytest

from dq.server.schemas import InvalidItem, NewItemIn, to_new_items
from dq.storage.types import NewItem


def test_items_equal_what_the_constructor_makes() -> None:
    raw: list[NewItemIn] = [
        {"value": "plain"},
        {"value": "aGk=", "encoding": "base64", "deadline": 5},
        {"value": "é", "delay_ms": 10, "key": "k-1"},
    ]
    got = to_new_items(raw)
    want = [
        NewItem(b"plain"),
        NewItem(b"hi", deadline=5),
        NewItem("é".encode(), delay_ms=10, key="k-1"),
    ]
    assert got == want
    assert [hash(g) for g in got] == [hash(w) for w in want]
    assert all(type(g) is NewItem for g in got)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got[0].value = b"changed"  # type: ignore[misc]


def test_refusals_name_the_item() -> None:
    with pytest.raises(InvalidItem) as both:
        to_new_items([{"value": "a"}, {"value": "b", "deadline": 1, "delay_ms": 1}])
    assert both.value.index == 1 and both.value.field == "delay_ms"
    with pytest.raises(InvalidItem) as bad:
        to_new_items([{"value": "!!", "encoding": "base64"}])
    assert bad.value.index == 0
