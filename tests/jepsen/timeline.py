"""Reading a history by fault: how long writes stopped after each fault, and the events
around a moment (for a failure's investigation).

``python -m tests.jepsen.timeline DIR`` prints each fault with its outage;
``--around MS`` prints every event within ``--span`` ms of that time instead.
"""

from __future__ import annotations

import argparse
import bisect
import json
from pathlib import Path
from typing import Any

from tests.jepsen.history import Event, load

__all__ = ["around", "outages"]


def outages(events: list[Event]) -> list[dict[str, Any]]:
    """Per fault: when it started, when it was healed, the seconds from its start to
    the first enqueue sent after it and acknowledged (None: none was), and how many
    enqueues were acknowledged between its start and its heal (``acked_during``)."""
    oks = sorted((e["invoke"], e["complete"]) for e in events if e["type"] == "enqueue" and e["outcome"] == "ok")  # fmt: skip
    invokes = [i for i, _ in oks]
    faults: list[dict[str, Any]] = []
    completes = sorted(c for _, c in oks)
    healed_at: dict[int, int] = {}
    for e in sorted((e for e in events if e["type"] == "nemesis"), key=lambda e: e["t"]):
        if e["phase"] == "start":
            faults.append({"fault": e["fault"], "detail": e.get("detail"), "t": e["t"]})
        elif e["phase"] == "healed" and faults and faults[-1]["fault"] == e["fault"]:
            faults[-1]["healed_after_s"] = round((e["t"] - faults[-1]["t"]) / 1000, 2)
            healed_at[len(faults) - 1] = e["t"]
    for n, f in enumerate(faults):
        i = bisect.bisect_left(invokes, f["t"])
        done = min((c for _, c in oks[i:]), default=None)
        f["writes_after_s"] = None if done is None else round((done - f["t"]) / 1000, 2)
        if n in healed_at:
            lo = bisect.bisect_left(completes, f["t"])
            f["acked_during"] = bisect.bisect_right(completes, healed_at[n]) - lo
    return faults


def _when(e: Event) -> int:
    return int(e.get("t", e.get("invoke", 0)))


def around(events: list[Event], t: int, span: int) -> list[Event]:
    return sorted((e for e in events if abs(_when(e) - t) <= span), key=_when)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("dir", type=Path)
    p.add_argument("--around", type=int, default=None, help="a time, ms since the epoch")
    p.add_argument("--span", type=int, default=2000)
    args = p.parse_args(argv)
    events = load(args.dir / "history.jsonl")
    rows = outages(events) if args.around is None else around(events, args.around, args.span)
    for row in rows:
        print(json.dumps(row, sort_keys=True))


if __name__ == "__main__":
    main()
