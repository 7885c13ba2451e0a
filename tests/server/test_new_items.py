"""``to_new_items`` and ``new_release`` build the same ``NewItem`` and ``Release`` their
constructors would (they write the frozen dataclasses' slots directly, for speed), and
``to_new_items`` refuses what the route refuses."""

from __future__ import annotations

import dataclasses

import pytest

from dq.server.schemas import InvalidItem, NewItemIn, new_release, to_new_items
from dq.storage.types import NewItem, Release


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


def test_releases_equal_what_the_constructor_makes() -> None:
    made = new_release(12, "e.c.1")
    assert made == Release(12, "e.c.1") and hash(made) == hash(Release(12, "e.c.1"))
    assert type(made) is Release and (made.id, made.receipt) == (12, "e.c.1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.id = 1  # type: ignore[misc]
