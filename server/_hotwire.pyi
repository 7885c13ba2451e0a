"""Type stub for the C extension ``dq.server._hotwire`` (server/_hotwire.c); bound to the
schemas and read through ``server/hot_bodies.py`` and ``server/answers.py``."""

from collections.abc import Sequence
from typing import Any

from typing_extensions import Buffer

def bind(
    new_item: type,
    release: type,
    max_deadline: int,
    max_id: int,
    lease_low: int,
    lease_high: int,
    receipt_low: int,
    receipt_high: int,
    /,
) -> None: ...
def enqueue_body(body: Buffer, limit: int, /) -> list[Any] | None: ...
def release_body(body: Buffer, limit: int, /) -> list[Any] | None: ...
def dequeue_body(
    body: Buffer, limit: int, /
) -> tuple[int, int | None, int, str | None, list[Any] | None] | None: ...
def enqueued(done: Sequence[Any], /) -> bytes: ...
def results(outcomes: Sequence[Any], /) -> bytes: ...
def dequeued(
    got: Sequence[Any],
    encoding: str | None,
    released: Sequence[Any] | None = None,
    queue_exists: bool = True,
) -> bytes: ...
def message(head: bytes, tail: bytes, body: bytes, /) -> bytes: ...
