"""``Buckets`` (``storage/buckets.py``): a token bucket gives at most ``burst +
per_second * t`` tokens over ``t`` seconds, says when its next token comes, and forgets
the per-group buckets that filled up again."""

from __future__ import annotations

import random

from dq.storage.buckets import Buckets
from dq.storage.types import RateLimit

T0 = 1_800_000_000_000


def test_a_bucket_never_gives_more_than_its_burst_and_rate_allow() -> None:
    rng = random.Random(7)
    rate = RateLimit(per_second=37.5, burst=4)
    b = Buckets(rate, T0)
    now, given = T0, []
    for _ in range(5000):
        now += rng.choice((0, 0, 1, 3, 10, 40))
        if b.has_token(None, now):
            b.take(None, now)
            given.append(now)
        else:
            assert b.next_token(None, now) > now
    for i, start in enumerate(given):  # over every span, from every token given
        for j in range(i, min(i + 60, len(given))):
            span = given[j] - start
            assert j - i + 1 <= rate.burst + rate.per_second * span / 1000 + 1e-9
    assert len(given) > 100


def test_next_token_is_when_a_whole_token_is_back() -> None:
    b = Buckets(RateLimit(per_second=50, burst=1), T0)
    b.take(None, T0)
    assert b.next_token(None, T0) == T0 + 20
    assert not b.has_token(None, T0 + 19)
    assert b.next_token(None, T0 + 19) == T0 + 20
    assert b.has_token(None, T0 + 20) and b.next_token(None, T0 + 20) == T0 + 20


def test_per_group_buckets_are_apart_and_full_ones_are_forgotten() -> None:
    b = Buckets(RateLimit(per_second=1, burst=1, per_group=True), T0)
    b.take("a", T0)
    assert not b.has_token("a", T0) and b.has_token("b", T0) and b.has_token(None, T0)
    for n in range(3000):
        b.take(f"g{n}", T0 + 2000 + n)
    assert b.groups_kept < 3000  # the early ones filled up again and were swept
    assert b.has_token("a", T0 + 2000)
