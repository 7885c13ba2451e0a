"""Items addressed by key through the Python client against a live ``dq serve``, over
HTTP and from a ``shm://`` client (which hands these calls to HTTP), as a user writes
them: a reminder rescheduled, a debounced digest, a payment timeout cancelled."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from dq.client import Client, ItemLeased, KeyNotFound, NewItem, QueueConfig
from tests.server.live import LiveServer, live_server

pytestmark = pytest.mark.integration  # a live server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("dq-keys") / "data"
    with live_server(data, env={"DQ_EXPIRE_INTERVAL_MS": "50"}) as s:
        yield s


@pytest.mark.parametrize("scheme", ["http", "shm"])
def test_by_key_from_the_client(server: LiveServer, scheme: str) -> None:
    url = server.url if scheme == "http" else f"shm://{server.data_dir}"
    q = f"reminders-{scheme}"
    with Client(url) as dq:
        dq.put_queue(q, QueueConfig(dedup_window_ms=3_600_000))
        item_id = dq.enqueue(q, b"renew", delay_ms=600_000, key="user/42")
        assert dq.peek_key(q, "user/42").id == item_id
        moved = dq.patch_key(q, "user/42", delay_ms=0, value="renew now")
        assert moved.id == item_id
        [item] = dq.dequeue(q, wait_ms=2000)
        assert (item.id, item.value) == (item_id, b"renew now")
        with pytest.raises(ItemLeased):
            dq.cancel_key(q, "user/42")
        dq.release(q, item.id, item.receipt)
        assert dq.peek_key(q, "user/42").state == "gone"

        first = dq.enqueue(q, b"digest 1", delay_ms=600_000, key="digest", on_duplicate="replace")
        [again] = dq.enqueue_many(
            q, [NewItem(b"digest 2", delay_ms=600_000, key="digest", on_duplicate="replace")]
        )
        assert again.id == first and again.replaced
        assert dq.peek_key(q, "digest").value == b"digest 2"

        assert dq.cancel_key(q, "digest") == first
        with pytest.raises(KeyNotFound):
            dq.peek_key(q, "digest")
        assert dq.queue(q).stats.pending == 0
