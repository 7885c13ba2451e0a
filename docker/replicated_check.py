#!/usr/bin/env python3
"""The HTTP half of ``make docker-smoke-replicated``: drive a replicated dq cluster from outside.

The cluster is three members reached at the URLs given (comma-separated, any order). The
phases bracket what the shell does to the containers; the state file carries what the
previous phase saw:

- ``before URLS STATE``: waits for a leader with a follower in its sync set, checks that a
  follower answers a write with 421 naming the leader, enqueues through the leader and
  waits until a follower's copy shows every acknowledged item. Prints the leader's node
  name (the compose service to stop) as the last line.
- ``failover URLS STATE``: with the leader killed, writes until a member accepts
  (bounded); checks the new leader's epoch is higher, that the new id is larger than
  every acknowledged one, and that every acknowledged item is delivered.
- ``rejoin URLS STATE``: with the old leader started again, waits until every member
  follows the new leader in its sync set and every copy agrees with the leader's.

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

QUEUE = "replicated-smoke"
ITEMS = 20
LEASE_MS = 60_000
#: bounded waits: the cluster electing its first leader, a failover, a rejoin (full resync)
ELECT_S = float(os.environ.get("SMOKE_ELECT_S", "120"))
FAILOVER_S = float(os.environ.get("SMOKE_FAILOVER_S", "60"))
REJOIN_S = float(os.environ.get("SMOKE_REJOIN_S", "120"))
TOKEN = os.environ.get("DQ_TOKEN", "")


class SmokeFailure(Exception):
    """A check failed; the message says which and what was seen."""


def call(
    base: str, method: str, path: str, body: Any = None, timeout: float = 15
) -> tuple[int, dict[str, str], Any]:
    """One HTTP request; returns (status, headers, decoded JSON or text).

    A connection failure is status 0 (the member is down or not listening yet).
    """
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if TOKEN:
        req.add_header("Authorization", f"Bearer {TOKEN}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, headers, raw = resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    except (OSError, urllib.error.URLError):
        return 0, {}, None
    text = raw.decode("utf-8", "replace")
    try:
        return status, headers, json.loads(text)
    except ValueError:
        return status, headers, text


def error_code(reply: Any) -> str | None:
    """The ``error`` code of an error answer (a string, or an object with ``code``)."""
    if not isinstance(reply, dict):
        return None
    err = reply.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return code if isinstance(code, str) else None
    return err if isinstance(err, str) else None


def expect(cond: bool, what: str, seen: Any) -> None:
    if not cond:
        raise SmokeFailure(f"{what}; got: {seen!r}")


def views(urls: list[str]) -> dict[str, dict[str, Any]]:
    """``GET /v1/cluster`` of every member that answers, by URL."""
    seen = {}
    for url in urls:
        status, _, reply = call(url, "GET", "/v1/cluster", timeout=5)
        if status == 200 and isinstance(reply, dict):
            seen[url] = reply
    return seen


def wait_for(what: str, timeout_s: float, probe: Any, seen: Any = None) -> Any:
    """Call ``probe()`` until it returns something truthy; fail after ``timeout_s``,
    with what ``seen()`` (default: the last probe) shows."""
    give_up = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < give_up:
        last = probe()
        if last:
            return last
        time.sleep(0.5)
    shown = last if seen is None else seen()
    raise SmokeFailure(f"{what} within {timeout_s:.0f} s; last seen: {shown!r}")


def roles(urls: list[str]) -> dict[str, Any]:
    """Each member's (role, epoch, sync set), or None when it does not answer."""
    answered = views(urls)
    return {
        u: (v.get("role"), v.get("epoch"), v.get("sync")) if (v := answered.get(u)) else None
        for u in urls
    }


def find_leader(urls: list[str], min_sync: int, newer_than: int = 0) -> Any:
    """(url, view) of the one member that is leader with ``min_sync`` sync members, or None."""
    leaders = [
        (url, view)
        for url, view in views(urls).items()
        if view.get("role") == "leader"
        and view.get("epoch", 0) > newer_than
        and len(view.get("sync") or []) >= min_sync
    ]
    return leaders[0] if len(leaders) == 1 else None


def queue_stats(url: str) -> dict[str, Any] | None:
    status, _, reply = call(url, "GET", f"/v1/queues/{QUEUE}", timeout=5)
    return reply["stats"] if status == 200 and isinstance(reply, dict) else None


def before(urls: list[str], state_file: Path) -> None:
    leader_url, view = wait_for(
        "one leader with a follower in its sync set",
        ELECT_S,
        lambda: find_leader(urls, 2),
        lambda: roles(urls),
    )
    nodes = {u: v["node"] for u, v in views(urls).items()}
    expect(len(nodes) == len(urls), "every member should answer GET /v1/cluster", nodes)
    follower = next(u for u in urls if u != leader_url)
    status, headers, reply = call(
        follower, "POST", f"/v1/queues/{QUEUE}/items", {"items": [{"value": "misdirected"}]}
    )
    expect(status == 421, "a follower should answer a write with 421", (status, reply))
    expect(error_code(reply) == "not_leader", "the 421 says not_leader", reply)
    leader_advertised = (view.get("leader") or {}).get("url")
    named = {k.lower(): v for k, v in headers.items()}.get("x-dq-leader")
    expect(named == leader_advertised, "the 421's X-DQ-Leader names the leader", (named, view))
    expect(reply.get("leader") == leader_advertised, "the 421's body names the leader", reply)

    acked: list[dict[str, Any]] = []
    for i in range(ITEMS // 2):
        status, _, reply = call(
            leader_url, "POST", f"/v1/queues/{QUEUE}/items", {"items": [{"value": f"one-{i}"}]}
        )
        expect(status == 200, "an enqueue through the leader is acknowledged", (status, reply))
        acked.append({"id": reply["items"][0]["id"], "value": f"one-{i}"})
    batch = [{"value": f"batch-{i}"} for i in range(ITEMS - len(acked))]
    status, _, reply = call(leader_url, "POST", f"/v1/queues/{QUEUE}/items", {"items": batch})
    expect(status == 200, "a batch through the leader is acknowledged", (status, reply))
    acked += [
        {"id": it["id"], "value": b["value"]} for it, b in zip(reply["items"], batch, strict=True)
    ]

    # Acknowledged means on the sync set's disks; the followers' copies show it (reads
    # are served by any member from its own copy).
    def copies_agree() -> bool:
        counts = [(queue_stats(u) or {}).get("pending") for u in urls]
        return counts.count(ITEMS) >= 2

    wait_for(f"{ITEMS} items pending on the leader and a follower", 30, copies_agree)
    state = {"urls": nodes, "leader": view["node"], "epoch": view["epoch"], "acked": acked}
    state_file.write_text(json.dumps(state))
    print(f"replicated before: leader {view['node']} epoch {view['epoch']}, {ITEMS} acknowledged")
    print(view["node"])


def failover(urls: list[str], state_file: Path) -> None:
    state = json.loads(state_file.read_text())
    old = state["leader"]
    # The survivors first; the old leader last, as a restart policy may bring it back
    # (it is a sync member with every acknowledged write: it may win the next election).
    ordered = sorted(urls, key=lambda u: state["urls"].get(u) == old)
    started = time.monotonic()
    give_up = started + FAILOVER_S
    accepted = None
    refusals: dict[int, int] = {}
    while accepted is None and time.monotonic() < give_up:
        for url in ordered:
            status, _, reply = call(
                url, "POST", f"/v1/queues/{QUEUE}/items", {"items": [{"value": "after"}]}, 5
            )
            if status == 200:
                accepted = (url, reply["items"][0]["id"])
                break
            refusals[status] = refusals.get(status, 0) + 1
        if accepted is None:
            time.sleep(0.2)
    expect(accepted is not None, f"a survivor accepts a write within {FAILOVER_S:.0f} s", refusals)
    assert accepted is not None
    new_url, new_id = accepted
    took = time.monotonic() - started
    view = views([new_url]).get(new_url, {})
    expect(view.get("role") == "leader", "the member that accepted is the leader", view)
    expect(view.get("epoch", 0) > state["epoch"], "the new leader's epoch is higher", view)
    max_old = max(a["id"] for a in state["acked"])
    expect(new_id > max_old, "ids are never reused across a failover", (new_id, max_old))

    seen: dict[str, int] = {}
    leased: list[dict[str, Any]] = []
    give_up = time.monotonic() + 30
    while len(seen) < ITEMS + 1 and time.monotonic() < give_up:
        status, _, reply = call(
            new_url,
            "POST",
            f"/v1/queues/{QUEUE}/dequeue",
            {"count": 100, "lease_ms": LEASE_MS, "wait_ms": 1000},
        )
        expect(status == 200, "dequeue on the new leader", (status, reply))
        for it in reply["items"]:
            seen[it["value"]] = it["id"]
            leased.append(it)
    missing = [a for a in state["acked"] if seen.get(a["value"]) != a["id"]]
    expect(not missing, "every acknowledged item is delivered after the failover", missing)
    body = {"items": [{"id": it["id"], "receipt": it["receipt"]} for it in leased]}
    status, _, reply = call(new_url, "POST", f"/v1/queues/{QUEUE}/release", body)
    expect(status == 200 and all(r["ok"] for r in reply["results"]), "release all", reply)
    state.update(new_leader=view["node"], new_epoch=view["epoch"], failover_s=took)
    state_file.write_text(json.dumps(state))
    print(
        f"replicated failover: {view['node']} leads epoch {view['epoch']} and took a write "
        f"{took:.1f} s after the first try; all {ITEMS} acknowledged items delivered"
    )


def rejoin(urls: list[str], state_file: Path) -> None:
    state = json.loads(state_file.read_text())
    by_node = {node: url for url, node in state["urls"].items()}
    lead_url = by_node[state["new_leader"]]

    def rejoined() -> Any:
        seen = views(urls)
        lead = seen.get(lead_url, {})
        followers = [v for u, v in seen.items() if u != lead_url]
        ok = (
            lead.get("role") == "leader"
            and lead.get("epoch") == state["new_epoch"]
            and sorted(lead.get("sync") or []) == sorted(by_node)
            and len(followers) == len(urls) - 1
            and all(v.get("role") == "follower" for v in followers)
            and all(v.get("epoch") == state["new_epoch"] for v in followers)
        )
        return ok and seen

    wait_for(
        f"every member follows {state['new_leader']} (epoch {state['new_epoch']}) in sync",
        REJOIN_S,
        rejoined,
        lambda: roles(urls),
    )

    def copies_agree() -> Any:
        stats = [queue_stats(u) for u in urls]
        return (
            all(
                s is not None and s["pending"] == 0 and s["next_id"] == stats[0]["next_id"]  # type: ignore[index]
                for s in stats
            )
            and stats
        )

    wait_for("every member's copy agrees with the leader's", 30, copies_agree)
    print(
        f"replicated rejoin: {state['leader']} is back and every member follows "
        f"{state['new_leader']} with the same copy"
    )


PHASES = {"before": before, "failover": failover, "rejoin": rejoin}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in PHASES:
        print(
            f"usage: replicated_check.py {'|'.join(PHASES)} URL,URL,URL STATE_FILE", file=sys.stderr
        )
        return 2
    phase, urls, state_file = argv[0], argv[1].split(","), Path(argv[2])
    try:
        PHASES[phase](urls, state_file)
    except (SmokeFailure, OSError, KeyError, ValueError, TypeError) as exc:
        print(f"replicated {phase}: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
