"""The hot routes' request bodies, read by compiled code into the operations' arguments.

``POST /v1/queues/{queue}/items``, ``/release`` and ``/dequeue`` bodies are read by
``server/_hotwire.c`` straight into what ``storage/itemops.py`` takes — ``NewItem`` and
``Release`` objects, a dequeue's fields — where pydantic's ``validate_json`` built dicts
that ``server/schemas.py``'s ``to_new_items`` / ``to_releases`` then turned into them
(~25,000 instructions an enqueue body, ~20,000 a release body, counted by callgrind).

The parser accepts a strict part of what the routes' schemas accept: plain JSON, each
field once, integers written as integers, values within the schemas' bounds, which this
module hands it from where they are kept (``storage/codec.py``,
``storage/validation.py``). Invariant: a body it reads gives exactly what the schema and
``to_new_items`` / ``to_releases`` give; any other body — invalid, unusual (``5.0`` or
``"5"`` for an integer, a repeated key), or a batch over ``limit`` — reads as ``None``,
and the hot route hands the request to the FastAPI app, which validates it with pydantic
and words every refusal (``tests/server/test_hotwire.py`` checks both with Hypothesis).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

from dq.server import _hotwire
from dq.server.schemas import Encoding
from dq.storage.codec import MAX_DEADLINE, MAX_ID
from dq.storage.types import NewItem, Release
from dq.storage.validation import LEASE_MS, RECEIPT

__all__ = ["DequeueBody", "dequeue_body", "enqueue_body", "release_body"]

#: A dequeue body's ``count``, ``lease_ms``, ``wait_ms``, ``encoding`` and ``release``
#: (``DequeueRequest``'s fields, ``None`` where the schema's default is).
DequeueBody = tuple[int, int | None, int, Encoding | None, list[Release] | None]

_hotwire.bind(
    NewItem, Release, MAX_DEADLINE, MAX_ID, LEASE_MS.low, LEASE_MS.high, RECEIPT.low, RECEIPT.high
)


# The C functions themselves, typed (a Python wrapper would cost a call a request).
#: ``enqueue_body(body, limit)``: an ``EnqueueRequest``'s items, at most ``limit``, as
#: ``to_new_items`` makes them.
enqueue_body = cast("Callable[[bytes, int], list[NewItem] | None]", _hotwire.enqueue_body)
#: ``release_body(body, limit)``: a ``ReleaseRequest``'s items as ``to_releases`` makes them.
release_body = cast("Callable[[bytes, int], list[Release] | None]", _hotwire.release_body)
#: ``dequeue_body(body, limit)``: a ``DequeueRequest``'s fields, ``release`` at most ``limit``.
dequeue_body = cast("Callable[[bytes, int], DequeueBody | None]", _hotwire.dequeue_body)
