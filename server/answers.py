"""The JSON answers of the item operations, formatted by hand, for every HTTP path.

The FastAPI routes (``server/routers/items.py``) and their fast path
(``server/hot_routes.py``) answer with these bytes, so that whichever path served a
request its answer is the same (``tests/server/test_hot_path.py`` compares them); the
shapes are the response models of ``server/schemas.py`` (``tests/server/
test_answers.py`` checks that they match). The enqueue's, the dequeue's and the
release's answers, one per hot request, are written in C (``server/_hotwire.c``; a
dequeue of one 256-byte item ~31,000 instructions in Python, ~2,500 there): strings
quoted as ``json.dumps`` quotes them (escaped, ASCII-only), everything else an integer.
``outcome_dict`` is the one result the other routes answer alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dq.server import _hotwire
from dq.storage.types import Enqueued, ItemOutcome

__all__ = ["dequeued_json", "enqueued_json", "outcome_dict", "results_json"]

#: ``EnqueueResponse``; ``replaced`` is said only when true (server/_hotwire.c).
enqueued_json: Callable[[Sequence[Enqueued]], bytes] = _hotwire.enqueued
#: ``Results``: a plain success (most of a release batch) is ``{"id":N,"ok":true}``, any
#: other outcome ``outcome_dict`` as ``json.dumps`` writes it (server/_hotwire.c).
results_json: Callable[[Sequence[ItemOutcome]], bytes] = _hotwire.results


#: ``DequeueResponse``, ``dequeued_json(got, encoding, released=None, queue_exists=True)``:
#: the items, each value as text (``utf-8``) when it is valid UTF-8 and ``encoding`` is
#: not ``base64``, else base64; ``released`` only when the request carried releases;
#: ``queue_exists`` only when it is false (the queue was never created)
#: (server/_hotwire.c).
dequeued_json: Callable[..., bytes] = _hotwire.dequeued


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
