"""JSON ⇄ client types for the HTTP API (``docs/http.md``); shared by sync and async.

Invariant: this is the only module that knows the wire shapes; transports only move
bytes and call these functions.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from dq.client.errors import ServerError, error_for
from dq.client.types import (
    Enqueued,
    Extend,
    Item,
    ItemStats,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    QueueStats,
    Release,
    Requeue,
)

__all__ = [
    "config_body",
    "enqueue_body",
    "error_from_response",
    "extend_body",
    "parse_enqueued",
    "parse_items",
    "parse_outcomes",
    "parse_queue",
    "release_body",
    "requeue_body",
]


def _value(value: bytes) -> dict[str, str]:
    try:
        return {"value": value.decode("utf-8"), "encoding": "utf-8"}
    except UnicodeDecodeError:
        return {"value": base64.b64encode(value).decode("ascii"), "encoding": "base64"}


def _when(d: dict[str, Any], deadline: int | None, delay_ms: int | None) -> dict[str, Any]:
    if deadline is not None:
        d["deadline"] = deadline
    if delay_ms is not None:
        d["delay_ms"] = delay_ms
    return d


def enqueue_body(items: Sequence[NewItem]) -> dict[str, Any]:
    return {"items": [_when(_value(i.value), i.deadline, i.delay_ms) for i in items]}


def release_body(batch: Sequence[Release]) -> dict[str, Any]:
    return {"items": [{"id": r.id, "receipt": r.receipt} for r in batch]}


def requeue_body(batch: Sequence[Requeue]) -> dict[str, Any]:
    return {
        "items": [_when({"id": r.id, "receipt": r.receipt}, r.deadline, r.delay_ms) for r in batch]
    }


def extend_body(batch: Sequence[Extend]) -> dict[str, Any]:
    return {"items": [{"id": e.id, "receipt": e.receipt, "lease_ms": e.lease_ms} for e in batch]}


def config_body(config: QueueConfig) -> dict[str, Any]:
    return {
        "default_lease_ms": config.default_lease_ms,
        "max_deliveries": config.max_deliveries,
        "dead_letter_queue": config.dead_letter_queue,
    }


def parse_enqueued(doc: Any) -> list[Enqueued]:
    return [Enqueued(e["id"], e["deadline"]) for e in doc["items"]]


def _decode(text: str, encoding: str) -> bytes:
    return base64.b64decode(text) if encoding == "base64" else text.encode("utf-8")


def parse_items(doc: Any) -> list[Item]:
    out = []
    for d in doc["items"]:
        s = d["stats"]
        out.append(
            Item(
                d["id"],
                d["receipt"],
                _decode(d["value"], d["encoding"]),
                d["deadline"],
                ItemStats(s["enqueue_time"], s["requeue_time"], s["dequeue_count"]),
                d["lease_expires"],
            )
        )
    return out


def parse_outcomes(doc: Any) -> list[Outcome]:
    return [
        Outcome(
            r["id"],
            r["ok"],
            r.get("error"),
            r.get("message"),
            r.get("receipt"),
            r.get("deadline"),
            r.get("lease_expires"),
        )
        for r in doc["results"]
    ]


def parse_queue(doc: Any) -> QueueInfo:
    c, s = doc["config"], doc["stats"]
    return QueueInfo(
        doc["name"],
        QueueConfig(c["default_lease_ms"], c.get("max_deliveries"), c.get("dead_letter_queue")),
        QueueStats(
            s["pending"],
            s["due"],
            s["delayed"],
            s["leased"],
            s["segments"],
            s["bytes_on_disk"],
            s.get("oldest_due_age_ms"),
            s["next_id"],
            dict(s.get("extra") or {}),
        ),
    )


def error_from_response(status: int, doc: Any, queue: str | None) -> ServerError:
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return error_for(status, doc["error"], str(doc.get("message", "")), queue=queue)
    return error_for(status, f"http_{status}", str(doc)[:200], queue=queue)
