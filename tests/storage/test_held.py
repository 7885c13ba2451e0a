"""``Group`` (``storage/held.py``) on its own: a group's held keys packed 16 bytes each,
handed out in order, items back from a lease first, and an operator's removal put back
where it was."""

from __future__ import annotations

import sys

from dq.storage.codec import encode_key
from dq.storage.held import FRONT, HELD, Group


def k(n: int) -> bytes:
    return encode_key(1000 + n, n)


def test_held_keys_go_out_in_the_order_they_were_held() -> None:
    g = Group("a")
    for n in range(1, 200):
        g.append(k(n))
    assert g.held == 199 and len(g.keys) == 199 * 16
    out = [g.pop_head() for _ in range(150)]
    assert out == [k(n) for n in range(1, 151)]
    # the consumed front was cut off, and its memory goes as the buffer shrinks
    assert len(g.keys) == 49 * 16 and sys.getsizeof(g.keys) <= 2 * len(g.keys) + 128
    assert g.head_key() == k(151) and g.first_key() == k(151) and g.held == 49


def test_an_item_back_from_a_lease_goes_first_once_it_arrives() -> None:
    g = Group("a")
    g.append(k(2))
    g.expect()
    assert g.returning == 1 and g.head_key() is None  # the group waits for it
    g.arrive(k(9))
    assert g.returning == 0 and g.head_key() == k(9) and g.first_key() == k(2)
    assert [g.pop_head(), g.pop_head()] == [k(9), k(2)]
    assert g.idle and g.back is None


def test_removal_and_put_back_keep_key_order() -> None:
    g = Group(None)
    for n in (1, 3, 5, 7):
        g.append(k(n))
    g.expect()
    g.arrive(k(20))
    assert g.holds(k(5)) and g.holds(k(20)) and not g.holds(k(4))
    assert (g.remove(k(5)), g.remove(k(20)), g.remove(k(4))) == (HELD, FRONT, 0)
    assert g.keys_after(b"") == [k(1), k(3), k(7)]
    g.put_back(k(5), HELD)
    g.put_back(k(20), FRONT)
    assert g.keys_after(k(1)) == [k(3), k(5), k(7), k(20)]
    assert [g.pop_head() for _ in range(5)] == [k(20), k(1), k(3), k(5), k(7)]


def test_a_group_keeps_no_buffer_until_it_holds_two_keys() -> None:
    """Most groups hold none or one key (a lease and its group's next item): the one key
    is kept as its own object, a buffer comes with the second and goes when the group
    has handed out all it held."""
    g = Group("a")
    assert g.keys == b"" and g.held == 0
    one = k(1)
    g.append(one)
    assert g.keys is one and g.held == 1 and g.head_key() == one and g.holds(one)
    g.append(k(2))
    assert isinstance(g.keys, bytearray) and g.held == 2
    assert [g.pop_head(), g.pop_head()] == [one, k(2)]
    assert g.keys == b"" and g.idle
    g.append(k(3))
    assert g.remove(k(3)) == HELD and g.keys == b"" and g.held == 0
    g.append(k(5))
    g.put_back(k(4), HELD)  # a one-key group takes a key back in order
    assert [g.pop_head(), g.pop_head()] == [k(4), k(5)] and g.held == 0


def test_a_group_with_a_lease_and_a_held_item_keeps_five_slots() -> None:
    """Every group the index holds pays for its slots (``bench/groups.py`` counts them in
    the memory a group costs): what lease expiry brings back lives apart, in a ``Back``
    made only while such an item is on its way or arrived, and dropped after."""
    g = Group("a")
    g.leased = 1
    g.append(k(1))
    assert sys.getsizeof(g) <= sys.getsizeof(object()) + 5 * 8 + 16  # GC header
    assert g.back is None and g.returning == 0 and g.front == []
    g.expect()
    assert g.back is not None and g.head_key() is None and not g.idle
    g.arrive(k(0))
    assert g.front == [k(0)] and g.head_key() == k(0)
    assert g.pop_head() == k(0) and g.back is None and g.head_key() == k(1)
    g.expect()
    g.not_coming()  # cancelled on its way: the group goes on
    assert g.back is None and g.head_key() == k(1)
