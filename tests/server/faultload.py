"""An HTTP load for the fault tests, and the check after a restart.

``Load`` runs producers (batches of incompressible values) and a consumer that releases
a part of what it gets. It records every enqueue and release the server acknowledged,
every status it answered, and which releases are in doubt (asked, not answered).
``check_restart`` reads everything back from a restarted server and applies the
invariant: every acknowledged item that was not released is there, with its value, and
no acknowledged release came back.
"""

from __future__ import annotations

import base64
import hashlib
import os
import threading
import time
from collections.abc import Callable

import httpx

__all__ = ["Load", "check_restart", "enqueue_ok", "wait_for"]


def _digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


class Load:
    """Producers and a consumer over HTTP; records what the server acknowledged."""

    def __init__(self, url: str, queue: str, *, value_bytes: int, batch: int) -> None:
        self.url = url
        self.queue = queue
        self.value_bytes = value_bytes
        self.batch = batch
        self.acked: dict[int, str] = {}  # id -> digest of the value
        self.released: set[int] = set()
        self.unsure: set[int] = set()  # a release was asked for: either outcome is right
        self.statuses: dict[int, int] = {}
        self.errors: dict[str, int] = {}  # requests that got no answer, by exception type
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._produce, daemon=True) for _ in range(3)]
        self.threads.append(threading.Thread(target=self._consume, daemon=True))

    def _count(self, status: int) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def _count_error(self, exc: httpx.HTTPError) -> None:
        with self.lock:
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1

    def describe(self) -> str:
        """What the load saw, for a failure message."""
        with self.lock:
            return f"acked {len(self.acked)}, statuses {self.statuses}, errors {self.errors}"

    def refusals(self) -> dict[int, int]:
        """Statuses other than 200, with their counts."""
        with self.lock:
            return {s: n for s, n in self.statuses.items() if s != 200}

    def _produce(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop.is_set():
                values = [os.urandom(self.value_bytes) for _ in range(self.batch)]
                body = {
                    "items": [
                        {"value": base64.b64encode(v).decode(), "encoding": "base64"}
                        for v in values
                    ]
                }
                try:
                    r = http.post(f"/v1/queues/{self.queue}/items", json=body)
                except httpx.HTTPError as exc:
                    # Unanswered, so not acknowledged. The server may be gone (SIGKILL:
                    # the test sets ``stop``) or the connection was dropped under load:
                    # keep producing on a new connection until told to stop.
                    self._count_error(exc)
                    time.sleep(0.1)
                    continue
                self._count(r.status_code)
                if r.status_code == 200:
                    with self.lock:
                        for item, v in zip(r.json()["items"], values, strict=True):
                            self.acked[item["id"]] = _digest(v)
                else:
                    time.sleep(0.05)

    def _consume(self) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            while not self.stop.is_set():
                try:
                    r = http.post(f"/v1/queues/{self.queue}/dequeue", json={"count": 4})
                    if r.status_code != 200 or not r.json()["items"]:
                        self._count(r.status_code)
                        time.sleep(0.1)
                        continue
                    items = [{"id": i["id"], "receipt": i["receipt"]} for i in r.json()["items"]]
                    with self.lock:
                        self.unsure.update(i["id"] for i in items)
                    r = http.post(f"/v1/queues/{self.queue}/release", json={"items": items})
                except httpx.HTTPError as exc:
                    self._count_error(exc)  # a release asked for stays ``unsure``
                    time.sleep(0.1)
                    continue
                self._count(r.status_code)
                if r.status_code == 200:
                    with self.lock:
                        self.released.update(res["id"] for res in r.json()["results"] if res["ok"])
                time.sleep(0.2)  # release a part of the load only: the backlog must grow

    def start(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(60)
            assert not t.is_alive(), "a load thread did not stop"


def wait_for(
    what: str, cond: Callable[[], bool], seconds: float, seen: Callable[[], str] | None = None
) -> None:
    """Wait until ``cond()``; on time-out fail with ``what`` and what ``seen()`` tells."""
    give_up = time.monotonic() + seconds
    while not cond():
        if time.monotonic() >= give_up:
            detail = f"; {seen()}" if seen is not None else ""
            raise AssertionError(f"{what} did not happen in {seconds} s{detail}")
        time.sleep(0.1)


def enqueue_ok(url: str, queue: str) -> bool:
    try:
        r = httpx.post(
            f"{url}/v1/queues/{queue}/items", json={"items": [{"value": "probe"}]}, timeout=30
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def check_restart(url: str, load: Load) -> None:
    """Drain the restarted server and compare with what ``load`` was told."""
    present: dict[int, str] = {}
    with httpx.Client(base_url=url, timeout=60) as http:
        while True:
            r = http.post(
                f"/v1/queues/{load.queue}/dequeue",
                json={"count": 1000, "lease_ms": 600_000, "encoding": "base64"},
            )
            assert r.status_code == 200, r.text
            items = r.json()["items"]
            if not items:
                break
            for i in items:
                assert i["id"] not in present, f"item {i['id']} delivered twice"
                present[i["id"]] = _digest(base64.b64decode(i["value"]))
    back = load.released & present.keys()
    assert not back, f"{len(back)} released items came back, e.g. {sorted(back)[:5]}"
    missing = [i for i in load.acked if i not in present and i not in load.unsure]
    assert not missing, f"{len(missing)} acknowledged items lost, e.g. {missing[:5]}"
    changed = [i for i, d in load.acked.items() if i in present and present[i] != d]
    assert not changed, f"{len(changed)} items came back with other values"
    assert load.acked, "nothing was acknowledged"
