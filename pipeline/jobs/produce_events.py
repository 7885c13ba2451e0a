"""Sample producer for the worked job: enqueue JSON events for ``event_counts`` to count.

Each value is ``{"event": str, "user": str, "ts": ms, "amount": num}``, the shape
``event_counts`` reads: events of four kinds from ``--users`` users, timestamps spread
over the last ``--minutes`` minutes, an amount on purchases only; ``--malformed N`` adds N
values that are not JSON (counted as ``_malformed`` by the job). It prints how many
events of each kind it enqueued, so the job's totals can be checked against it. Needs
only the client (no Spark); the same ``--seed`` gives the same events.

    python -m dq.pipeline.jobs.produce_events --url http://127.0.0.1:8080 --queue events \\
        --count 10000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence

from dq.client import Client, ClientError

__all__ = ["KINDS", "build_parser", "main", "make_events"]

#: the event kinds produced
KINDS = ("view", "click", "add_to_cart", "purchase")
_WEIGHTS = (60, 25, 10, 5)


def make_events(
    count: int, *, users: int, minutes: int, now_ms: int, rng: random.Random
) -> list[dict[str, object]]:
    """``count`` events as ``event_counts`` expects them."""
    events: list[dict[str, object]] = []
    for kind in rng.choices(KINDS, weights=_WEIGHTS, k=count):
        amount = round(rng.uniform(1, 200), 2) if kind == "purchase" else 0.0
        events.append(
            {
                "event": kind,
                "user": f"user-{rng.randrange(users)}",
                "ts": now_ms - rng.randrange(max(1, minutes * 60_000)),
                "amount": amount,
            }
        )
    return events


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n


def _count(text: str) -> int:
    n = int(text)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="produce_events", description=__doc__.split("\n")[0])
    p.add_argument("--url", default=os.environ.get("DQ_URL", "http://127.0.0.1:8080"))
    p.add_argument("--queue", default="events")
    p.add_argument("--token", default=os.environ.get("DQ_TOKEN"))
    p.add_argument("--count", type=_count, default=1000, help="events to enqueue (1000)")
    p.add_argument("--users", type=_positive, default=50, help="distinct users (50)")
    p.add_argument("--minutes", type=_positive, default=10, help="spread of ts, back from now")
    p.add_argument("--malformed", type=_count, default=0, help="values that are not JSON (0)")
    p.add_argument("--seed", type=int, help="random seed, for the same events every run")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rng = random.Random(args.seed)
    events = make_events(
        args.count, users=args.users, minutes=args.minutes, now_ms=int(time.time() * 1000), rng=rng
    )
    values = [json.dumps(e, separators=(",", ":")).encode() for e in events]
    values += [b"not an event %d" % i for i in range(args.malformed)]
    try:
        with Client(args.url, token=args.token) as dq:
            dq.enqueue_many(args.queue, values)
    except ClientError as exc:  # the requests before the failed one stay enqueued
        print(f"produce_events: {exc} ({len(exc.done)} of {len(values)} enqueued)", file=sys.stderr)
        return 1
    kinds = Counter(str(e["event"]) for e in events)
    per_kind = ", ".join(f"{kinds[k]} {k}" for k in KINDS)
    print(
        f"enqueued {len(values)} values to {args.queue} at {args.url}: {per_kind}; "
        f"{args.malformed} malformed"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
