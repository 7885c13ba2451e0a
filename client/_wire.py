"""JSON ⇄ client types for the HTTP API (``docs/http.md``); shared by sync and async.

Invariant: this is the only module that knows the wire shapes; transports only move
bytes and call these functions.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii as _quote  # type: ignore[attr-defined]
from typing import Any

from dq.client.errors import ServerError, error_for
from dq.client.types import (
    BackupResult,
    BrowsedItem,
    BrowsePage,
    Dequeued,
    Enqueued,
    Extend,
    Fail,
    GroupInfo,
    Item,
    ItemStats,
    MovedTo,
    NewItem,
    Outcome,
    QueueConfig,
    QueueInfo,
    QueueStats,
    RateLimit,
    Reason,
    RedriveResult,
    Release,
    Requeue,
    RetryPolicy,
)

__all__ = [
    "config_body",
    "dequeue_body",
    "dequeue_json",
    "enqueue_body",
    "enqueue_json",
    "enqueue_one_json",
    "error_from_response",
    "extend_body",
    "fail_body",
    "failed_outcome",
    "parse_backup",
    "parse_browsed",
    "parse_dequeued",
    "parse_enqueued",
    "parse_groups",
    "parse_items",
    "parse_outcomes",
    "parse_page",
    "parse_queue",
    "parse_redrive",
    "queue_from_stats",
    "release_body",
    "release_json",
    "release_one_json",
    "requeue_body",
    "value_json",
]


def value_json(value: bytes) -> dict[str, str]:
    """``{"value", "encoding"}`` for ``value``: text if it is UTF-8, else base64."""
    return _value(value)


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


def _keyed(
    d: dict[str, Any], key: str | None, group: str | None = None, on_duplicate: str = "keep"
) -> dict[str, Any]:
    if key is not None:
        d["key"] = key
    if group is not None:
        d["group"] = group
    if on_duplicate != "keep":
        d["on_duplicate"] = on_duplicate
    return d


# The hot calls' bodies written as text: the same bytes as the compact JSON of the
# ``*_body`` dicts (the client's tests compare both), without building the dicts or
# walking them in the encoder. ``None`` when a field is not of the plain type (an ``int``
# subclass, say): then the dict goes through the encoder as before.


def _item_json(
    value: bytes, deadline: Any, delay_ms: Any, key: Any, group: Any = None, how: Any = "keep"
) -> str | None:
    if type(value) is not bytes:
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        out = '{"value":"' + base64.b64encode(value).decode("ascii") + '","encoding":"base64"'
    else:
        out = '{"value":' + _quote(text) + ',"encoding":"utf-8"'
    if deadline is not None:
        if type(deadline) is not int:
            return None
        out += f',"deadline":{deadline}'
    if delay_ms is not None:
        if type(delay_ms) is not int:
            return None
        out += f',"delay_ms":{delay_ms}'
    if key is not None:
        if type(key) is not str:
            return None
        out += ',"key":' + _quote(key)
    if group is not None:
        if type(group) is not str:
            return None
        out += ',"group":' + _quote(group)
    if how != "keep":
        if type(how) is not str:
            return None
        out += ',"on_duplicate":' + _quote(how)
    return out + "}"


def enqueue_one_json(value: bytes, deadline: Any, delay_ms: Any, key: Any) -> bytes | None:
    """``enqueue_body([NewItem(value, deadline, delay_ms, key)])`` as JSON bytes."""
    item = _item_json(value, deadline, delay_ms, key)
    return None if item is None else ('{"items":[' + item + "]}").encode()


def enqueue_json(items: Sequence[NewItem]) -> bytes | None:
    """``enqueue_body(items)`` as JSON bytes."""
    parts = []
    for i in items:
        item = _item_json(i.value, i.deadline, i.delay_ms, i.key, i.group, i.on_duplicate)
        if item is None:
            return None
        parts.append(item)
    return ('{"items":[' + ",".join(parts) + "]}").encode()


def _releases_json(batch: Sequence[Release]) -> str | None:
    parts = []
    for r in batch:
        if type(r.id) is not int or type(r.receipt) is not str:
            return None
        parts.append(f'{{"id":{r.id},"receipt":{_quote(r.receipt)}}}')
    return "[" + ",".join(parts) + "]"


def release_json(batch: Sequence[Release]) -> bytes | None:
    """``release_body(batch)`` as JSON bytes."""
    items = _releases_json(batch)
    return None if items is None else ('{"items":' + items + "}").encode()


def release_one_json(item_id: Any, receipt: Any) -> bytes | None:
    """``release_body([Release(item_id, receipt)])`` as JSON bytes."""
    if type(item_id) is not int or type(receipt) is not str:
        return None
    return f'{{"items":[{{"id":{item_id},"receipt":{_quote(receipt)}}}]}}'.encode()


def dequeue_json(
    count: Any, wait_ms: Any, lease_ms: Any, release: Sequence[Release]
) -> bytes | None:
    """``dequeue_body(count, wait_ms, lease_ms, release)`` as JSON bytes."""
    if type(count) is not int or type(wait_ms) is not int:
        return None
    out = f'{{"count":{count},"wait_ms":{wait_ms}'
    if lease_ms is not None:
        if type(lease_ms) is not int:
            return None
        out += f',"lease_ms":{lease_ms}'
    if release:
        items = _releases_json(release)
        if items is None:
            return None
        out += ',"release":' + items
    return (out + "}").encode()


def dequeue_body(
    count: int, wait_ms: int, lease_ms: int | None, release: Sequence[Release]
) -> dict[str, Any]:
    body: dict[str, Any] = {"count": count, "wait_ms": wait_ms}
    if lease_ms is not None:
        body["lease_ms"] = lease_ms
    if release:
        body["release"] = release_body(release)["items"]
    return body


def enqueue_body(items: Sequence[NewItem]) -> dict[str, Any]:
    return {
        "items": [
            _keyed(_when(_value(i.value), i.deadline, i.delay_ms), i.key, i.group, i.on_duplicate)
            for i in items
        ]
    }


def release_body(batch: Sequence[Release]) -> dict[str, Any]:
    return {"items": [{"id": r.id, "receipt": r.receipt} for r in batch]}


def requeue_body(batch: Sequence[Requeue]) -> dict[str, Any]:
    return {
        "items": [_when({"id": r.id, "receipt": r.receipt}, r.deadline, r.delay_ms) for r in batch]
    }


def fail_body(batch: Sequence[Fail]) -> dict[str, Any]:
    return {"items": [{"id": f.id, "receipt": f.receipt, "error": f.error} for f in batch]}


def extend_body(batch: Sequence[Extend]) -> dict[str, Any]:
    return {"items": [{"id": e.id, "receipt": e.receipt, "lease_ms": e.lease_ms} for e in batch]}


def config_body(config: QueueConfig) -> dict[str, Any]:
    """The PUT body; the delivery rules only when set, so a config without them is
    what a server older than them takes."""
    body: dict[str, Any] = {
        "default_lease_ms": config.default_lease_ms,
        "max_deliveries": config.max_deliveries,
        "dead_letter_queue": config.dead_letter_queue,
        "dedup_window_ms": config.dedup_window_ms,
    }
    if config.retry is not None:  # left out without one: a server before policies takes it
        body["retry"] = _retry_body(config.retry)
    if config.group_limit is not None:
        body["group_limit"] = config.group_limit
    if config.leased_limit is not None:
        body["leased_limit"] = config.leased_limit
    if config.fair:
        body["fair"] = True
    rate = config.rate_limit
    if rate is not None:
        body["rate_limit"] = {
            "per_second": rate.per_second,
            "burst": rate.burst,
            "per_group": rate.per_group,
        }
    return body


def _retry_body(p: RetryPolicy) -> dict[str, Any]:
    if p.delays_ms is not None:
        return {"delays_ms": list(p.delays_ms)}
    return {
        "initial_ms": p.initial_ms,
        "multiplier": p.multiplier,
        "max_ms": p.max_ms,
        "jitter": p.jitter,
    }


def _retry(d: dict[str, Any] | None) -> RetryPolicy | None:
    if d is None:
        return None
    if d.get("delays_ms") is not None:
        return RetryPolicy(delays_ms=tuple(d["delays_ms"]))
    return RetryPolicy(d.get("initial_ms"), d["multiplier"], d["max_ms"], d["jitter"])


def parse_enqueued(doc: Any) -> list[Enqueued]:
    return [
        Enqueued(
            e["id"], e["deadline"], bool(e.get("duplicate", False)), bool(e.get("replaced", False))
        )
        for e in doc["items"]
    ]


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
                d.get("group"),
                d.get("last_error"),
                d.get("last_error_at"),
            )
        )
    return out


def parse_dequeued(doc: Any) -> Dequeued:
    return Dequeued(
        parse_items(doc), _outcomes(doc.get("released") or []), doc.get("queue_exists") is not False
    )


def failed_outcome(doc: Any) -> Outcome | None:
    """A one-item answer's outcome if it failed; ``None`` if it succeeded."""
    result = doc["results"][0]
    return None if result["ok"] else _outcomes([result])[0]


def parse_outcomes(doc: Any) -> list[Outcome]:
    return _outcomes(doc["results"])


def _outcomes(results: list[Any]) -> list[Outcome]:
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
        for r in results
    ]


def _config(c: dict[str, Any]) -> QueueConfig:
    rate = c.get("rate_limit")
    return QueueConfig(
        c["default_lease_ms"],
        c.get("max_deliveries"),
        c.get("dead_letter_queue"),
        c.get("dedup_window_ms", 300_000),
        _retry(c.get("retry")),
        c.get("group_limit"),
        c.get("leased_limit"),
        bool(c.get("fair", False)),
        None
        if rate is None
        else RateLimit(rate["per_second"], rate["burst"], bool(rate.get("per_group", False))),
    )


def parse_groups(doc: Any) -> list[GroupInfo]:
    return [GroupInfo(g["group"], g["leased"], g["due"], g["held"]) for g in doc["groups"]]


def _stats(s: dict[str, Any]) -> QueueStats:
    rates = s.get("rates") or s  # HTTP nests the rates; the shm ring's STATS does not
    return QueueStats(
        s["pending"],
        s["due"],
        s["delayed"],
        s["leased"],
        s["segments"],
        s["bytes_on_disk"],
        s.get("oldest_due_age_ms"),
        s["next_id"],
        dict(s.get("extra") or {}),
        bool(s.get("paused", False)),
        s.get("paused_since"),
        s.get("dead_lettered", 0),
        s.get("lease_expired", 0),
        s.get("oldest_lease_age_ms"),
        float(rates.get("enqueue_per_s", 0.0)),
        float(rates.get("dequeue_per_s", 0.0)),
        float(rates.get("release_per_s", 0.0)),
        s.get("groups", 0),
        s.get("held", 0),
        s.get("rate_limited", 0),
    )


def parse_queue(doc: Any) -> QueueInfo:
    return QueueInfo(doc["name"], _config(doc["config"]), _stats(doc["stats"]))


def queue_from_stats(doc: dict[str, Any]) -> QueueInfo:
    """A queue from the engine's flat stats object (the shm ring's STATS answer)."""
    config = dict(doc["config"])
    if doc.get("dead_letter_queue"):
        config["dead_letter_queue"] = doc["dead_letter_queue"]
    return QueueInfo(doc["name"], _config(config), _stats(doc))


def parse_browsed(d: Any) -> BrowsedItem:
    s = d.get("stats")
    value = d.get("value")
    moved = d.get("moved_to")
    return BrowsedItem(
        d["id"],
        d.get("deadline"),
        d["state"],
        None if s is None else ItemStats(s["enqueue_time"], s["requeue_time"], s["dequeue_count"]),
        d.get("value_size", 0),
        None if value is None else _decode(value, d.get("encoding", "utf-8")),
        d.get("lease_expires"),
        d.get("dead_lettered_from"),
        None if moved is None else MovedTo(moved["queue"], moved["id"]),
        d.get("group"),
        tuple(Reason(r["error"], r["at"], r["delivery"]) for r in d.get("errors") or ()),
    )


def parse_page(doc: Any) -> BrowsePage:
    return BrowsePage([parse_browsed(d) for d in doc["items"]], doc.get("next"))


def parse_redrive(doc: Any) -> RedriveResult:
    failed = [Outcome(f["id"], False, f.get("error"), f.get("message")) for f in doc["failed"]]
    return RedriveResult(doc["moved"], list(doc.get("to") or []), failed)


def parse_backup(doc: Any) -> BackupResult:
    return BackupResult(doc["path"], doc["bytes"], doc.get("files", 0))


def error_from_response(status: int, doc: Any, queue: str | None) -> ServerError:
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return error_for(status, doc["error"], str(doc.get("message", "")), queue=queue)
    return error_for(status, f"http_{status}", str(doc)[:200], queue=queue)
