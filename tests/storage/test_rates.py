"""Per-queue rates over the last minute."""

from __future__ import annotations

from dq.storage.rates import Rates


def test_rates_count_the_last_minute_only() -> None:
    r = Rates()
    assert r.per_second("enqueue", 1_000_000) == 0.0
    r.add("enqueue", 30, 1_000_000)
    r.add("enqueue", 30, 1_020_000)
    r.add("release", 6, 1_020_000)
    assert r.per_second("enqueue", 1_030_000) == 1.0
    assert r.per_second("release", 1_030_000) == 0.1
    assert r.per_second("dequeue", 1_030_000) == 0.0
    assert r.per_second("enqueue", 1_061_000) == 0.5  # the first 30 left the window
    assert r.per_second("enqueue", 1_081_000) == 0.0  # idle for a minute
    r.add("enqueue", 60, 1_200_000)  # a bucket reused after the window wrapped
    assert r.per_second("enqueue", 1_200_500) == 1.0
