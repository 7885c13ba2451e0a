#!/usr/bin/env python3
"""The HTTP half of ``make docker-smoke``: drive a containerised ``dq`` through its published port.

``before URL STATE`` runs before the stack restarts, ``after URL STATE`` after it; the state
file carries what ``before`` did. ``spark-before`` and ``spark-after`` (``SMOKE_SPARK=1``)
bracket a run of the Spark worked job: events in, the job's Parquet counts (JSON on stdin)
and an acknowledged, empty queue out. Together they check the deploy's promise: what was
enqueued and not released survives a restart of the stack (the named volume keeps the
data), a released item stays gone, a lease does not survive a restart (at-least-once: the
item comes back and the old receipt is stale), and ids are never reused across restarts.

Only the standard library, so it runs with any python3 >= 3.11 on the host. Every request
has a timeout; every wait is bounded. Exits non-zero with a message on the first failure.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

QUEUE = "smoke"
#: the queue the Spark worked job (pipeline/jobs/event_counts.py) reads by default
SPARK_QUEUE = "events"
LEASE_MS = 60_000
#: gamma is not due before the restart and is due within a few seconds after it
#: (the unit test, which restarts a local server in about a second, makes it shorter).
GAMMA_DELAY_MS = int(os.environ.get("SMOKE_GAMMA_DELAY_MS", "8000"))
AFTER_WAIT_S = 60.0


class SmokeFailure(Exception):
    """A check failed; the message says which and what was seen."""


def call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One HTTP request; returns (status, decoded JSON or text)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def expect(cond: bool, what: str, seen: Any) -> None:
    if not cond:
        raise SmokeFailure(f"{what}; got: {seen!r}")


def post(base: str, path: str, body: Any) -> Any:
    status, reply = call(base, "POST", path, body)
    expect(status == 200, f"POST {path} should answer 200", (status, reply))
    return reply


def dequeue(base: str, count: int, wait_ms: int = 0) -> list[dict[str, Any]]:
    body = {"count": count, "lease_ms": LEASE_MS, "wait_ms": wait_ms}
    items: list[dict[str, Any]] = post(base, f"/v1/queues/{QUEUE}/dequeue", body)["items"]
    return items


def release(base: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    body = {"items": [{"id": it["id"], "receipt": it["receipt"]} for it in items]}
    results: list[dict[str, Any]] = post(base, f"/v1/queues/{QUEUE}/release", body)["results"]
    return results


def before(base: str, state_file: Path) -> None:
    status, reply = call(base, "GET", "/healthz")
    expect(status == 200, "GET /healthz should answer 200", (status, reply))
    new = [{"value": "alpha"}, {"value": "beta"}, {"value": "gamma", "delay_ms": GAMMA_DELAY_MS}]
    ids = [it["id"] for it in post(base, f"/v1/queues/{QUEUE}/items", {"items": new})["items"]]
    expect(len(ids) == 3 and ids == sorted(set(ids)), "ids should be strictly increasing", ids)
    got = dequeue(base, 10)
    expect([it["value"] for it in got] == ["alpha", "beta"], "alpha and beta are due", got)
    results = release(base, got[:1])
    expect(results[0]["ok"] is True, "release of alpha should succeed", results)
    status, text = call(base, "GET", "/metrics")
    expect(status == 200 and isinstance(text, str), "GET /metrics should answer text", status)
    state = {"ids": ids, "beta": got[1]}
    state_file.write_text(json.dumps(state))
    print(f"smoke before: enqueued {ids}, released alpha, beta leased, gamma delayed")


def after(base: str, state_file: Path) -> None:
    state = json.loads(state_file.read_text())
    alpha_id, beta_id, gamma_id = state["ids"]
    # A dequeue of a queue that does not exist waits for it (a worker may start before
    # its producer), so ask first whether the queue came back at all.
    status, reply = call(base, "GET", f"/v1/queues/{QUEUE}")
    expect(status == 200, f"queue {QUEUE} should survive the restart", (status, reply))
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + AFTER_WAIT_S
    while len(seen) < 2 and time.monotonic() < deadline:
        seen += dequeue(base, 10, wait_ms=2_000)
    values = [it["value"] for it in seen]
    expect(values == ["beta", "gamma"], "beta (lease lost) and gamma should survive", values)
    expect([it["id"] for it in seen] == [beta_id, gamma_id], "ids survive", seen)
    stale = release(base, [state["beta"]])[0]
    expect(stale["ok"] is False, "a receipt from before the restart should be stale", stale)
    results = release(base, seen)
    expect(all(r["ok"] for r in results), "release of beta and gamma should succeed", results)
    delta = post(base, f"/v1/queues/{QUEUE}/items", {"items": [{"value": "delta"}]})["items"][0]
    expect(delta["id"] > gamma_id, "ids are never reused across restarts", (delta, gamma_id))
    last = dequeue(base, 10)
    expect([it["value"] for it in last] == ["delta"], "only delta is left (alpha is gone)", last)
    release(base, last)
    print(
        f"smoke after: beta and gamma came back, alpha ({alpha_id}) stayed released, "
        f"new id {delta['id']} > {gamma_id}"
    )


def spark_before(base: str, state_file: Path) -> None:
    """Enqueue JSON events (and one malformed value) for the worked job ``event_counts``."""
    minute = 1_795_000_000_000 // 60_000 * 60_000
    events = [("click", f"u{i % 7}", minute + i * 100, 1.5) for i in range(40)]
    events += [("buy", f"u{i % 3}", minute + 60_000 + i, 10.0) for i in range(10)]
    new = [
        {"value": json.dumps({"event": e, "user": u, "ts": t, "amount": a})}
        for e, u, t, a in events
    ]
    new.append({"value": "not json"})
    post(base, f"/v1/queues/{SPARK_QUEUE}/items", {"items": new})
    expected = {"click": 40, "buy": 10, "_malformed": 1}
    state_file.write_text(json.dumps(expected))
    print(f"smoke spark before: enqueued {len(new)} events into {SPARK_QUEUE!r}")


def spark_after(base: str, state_file: Path) -> None:
    """Check the job's output (``{event: events}`` JSON on stdin) and that it acknowledged."""
    expected = json.loads(state_file.read_text())
    counted = json.loads(sys.stdin.read())
    expect(counted == expected, f"the job's Parquet should count {expected}", counted)
    status, reply = call(base, "GET", f"/v1/queues/{SPARK_QUEUE}")
    expect(status == 200, f"GET /v1/queues/{SPARK_QUEUE} should answer 200", (status, reply))
    stats = reply["stats"]
    expect((stats["pending"], stats["leased"]) == (0, 0), "the job released every item", stats)
    print(f"smoke spark after: Parquet counts {counted}, queue drained and acknowledged")


PHASES = {
    "before": before,
    "after": after,
    "spark-before": spark_before,
    "spark-after": spark_after,
}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in PHASES:
        print(f"usage: smoke_check.py {'|'.join(PHASES)} BASE_URL STATE_FILE", file=sys.stderr)
        return 2
    phase, base, state_file = argv[0], argv[1], Path(argv[2])
    try:
        PHASES[phase](base, state_file)
    except (SmokeFailure, OSError, KeyError, ValueError) as exc:
        print(f"smoke {phase}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
