"""The JSON answers of the item operations, formatted by hand, for every HTTP path.

The FastAPI routes (``server/routers/items.py``) and their fast path
(``server/hot_routes.py``) answer with these bytes, so that whichever path served a
request its answer is the same (``tests/server/test_hot_path.py`` compares them); the
shapes are the response models of ``server/schemas.py`` (``tests/server/
test_answers.py`` checks that they match). Formatting directly is ~35 % cheaper
than building a dict per item and serializing the lot; strings are quoted as
``json.dumps`` quotes them (escaped, ASCII-only) and everything else is an integer.
The enqueue's and the release's answers, one per hot request, are written in C
(``server/_hotwire.c``: ~10,000 instructions each in Python, ~1,500 there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]

from dq.server import _hotwire
from dq.server.schemas import Encoding, encode_value
from dq.storage.types import Delivery, Enqueued, ItemOutcome

__all__ = ["dequeued_json", "enqueued_json", "outcome_dict", "results_json"]

#: ``EnqueueResponse``; ``replaced`` is said only when true (server/_hotwire.c).
enqueued_json: Callable[[Sequence[Enqueued]], bytes] = _hotwire.enqueued
#: ``Results``: a plain success (most of a release batch) is ``{"id":N,"ok":true}``, any
#: other outcome ``outcome_dict`` as ``json.dumps`` writes it (server/_hotwire.c).
results_json: Callable[[Sequence[ItemOutcome]], bytes] = _hotwire.results
#: What ``results_json`` writes around the results themselves.
_RESULTS_OPEN = b'{"results":['


#: ``json.dumps(text)`` for a ``str``, without its two Python layers (it calls this).
_quoted = encode_basestring_ascii

#: One delivered item (``ItemOut``).
_ITEM_JSON = (
    '{"id":%d,"receipt":%s,"value":%s,"encoding":"%s","deadline":%d,'
    '"stats":{"enqueue_time":%d,"requeue_time":%d,"dequeue_count":%d},"lease_expires":%d,'
    '"group":%s}'
)


#: The end of a delivered item that failed before (``ItemOut.last_error``).
_ERROR_JSON = ',"last_error":%s,"last_error_at":%d}'


def dequeued_json(
    got: Sequence[Delivery],
    encoding: Encoding | None,
    released: Sequence[ItemOutcome] | None = None,
    queue_exists: bool = True,
) -> bytes:
    """``DequeueResponse``: the items; ``released`` only when the request carried
    releases; ``queue_exists`` only when it is false (the queue was never created)."""
    dumps = _quoted
    parts = []
    for d in got:
        text, enc = encode_value(d.value, encoding)
        s = d.stats
        item = _ITEM_JSON % (
            d.id, dumps(d.receipt), dumps(text), enc, d.deadline,
            s.enqueue_time, s.requeue_time, s.dequeue_count, d.lease_expires,
            "null" if d.group is None else dumps(d.group),
        )  # fmt: skip
        if d.last_error is not None:  # said only for an item that failed before
            item = item[:-1] + _ERROR_JSON % (dumps(d.last_error), d.last_error_at or 0)
        parts.append(item)
    if released is not None:
        inner = results_json(released)[len(_RESULTS_OPEN) : -2].decode("ascii")
        tail = '],"released":[' + inner + "]}"
    elif not queue_exists:
        tail = '],"queue_exists":false}'
    else:
        tail = "]}"
    return ('{"items":[' + ",".join(parts) + tail).encode()


def outcome_dict(o: ItemOutcome) -> dict[str, object]:
    """One ``ItemResult``."""
    d: dict[str, object] = {"id": o.id, "ok": o.error is None}
    if o.error is not None:
        d["error"] = o.error
        d["message"] = o.message or o.error
    if o.receipt is not None:
        d["receipt"] = o.receipt
    if o.deadline is not None:
        d["deadline"] = o.deadline
    if o.lease_expires is not None:
        d["lease_expires"] = o.lease_expires
    return d
