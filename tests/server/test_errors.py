"""The one mapping from storage errors to HTTP statuses."""

from __future__ import annotations

import pytest

from dq.server.errors import status_for
from dq.storage import errors as e


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (e.InvalidArgument("x"), 400),
        (e.InvalidQueueName("x"), 400),
        (e.InvalidDeadline("x"), 400),
        (e.InvalidReceipt("x"), 400),
        (e.ValueTooLarge("x"), 413),
        (e.BatchTooLarge("x"), 413),
        (e.QueueNotFound("x"), 404),
        (e.ItemNotFound("x"), 404),
        (e.StaleReceipt("x"), 409),
        (e.ConfigConflict("x"), 409),
        (e.StorageFull("x"), 507),
        (e.EngineUnavailable("x"), 503),
        (e.QueueDamaged("x"), 503),
        (e.TooManyQueues("x"), 507),
        (e.DataDirLocked("x"), 503),
        (e.CorruptionError("x"), 500),
    ],
)
def test_status_for(exc: e.StorageError, status: int) -> None:
    assert status_for(exc) == status


def test_every_storage_error_class_is_mapped_deliberately() -> None:
    classes = {c for n in e.__all__ if isinstance(c := getattr(e, n), type)} - {e.StorageError}
    unmapped = {c for c in classes if status_for(c("x")) == 500}
    assert unmapped == {e.CorruptionError}  # a server fault, not bad input


def test_codes_map_like_their_classes() -> None:
    """A code read off a ring maps to the status its class answers over HTTP."""
    classes = [c for n in e.__all__ if isinstance(c := getattr(e, n), type)]
    for cls in classes:
        assert e.status_for_code(cls.code) == status_for(cls("x"))
    assert e.status_for_code("no_such_code") == 500


def test_ring_statuses_map_like_the_http_api() -> None:
    """The shm transport raises the status the HTTP API would answer for each code."""
    from dq.shm.command_ring import Status

    codes = {c.code: c for n in e.__all__ if isinstance(c := getattr(e, n), type)}
    for status in Status:
        if status.code in codes:
            assert status.http_status == status_for(codes[status.code]("x")), status
    assert Status.INTERNAL.http_status == 500 and Status.MALFORMED.http_status == 400
