"""Hosts the submission, broadcast and telemetry rings beside the engine (server side).

Owns their shared-memory objects, the discovery file ``dq-rings.json`` in the data
directory (docs/shm.md, "Discovery of the other three rings") and the three server
threads: the submission drainer, the event publisher and the telemetry publisher.
Invariant kept: the discovery file exists only while the rings it names are served; on
``close`` the threads stop, then the file and the objects are removed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from dq.shm import broadcast_ring, submission_ring, telemetry_ring
from dq.shm.attach import create_shm, shm_prefix, unlink_shm
from dq.shm.events import EventPublisher
from dq.shm.submission_drain import SubmissionDrainer
from dq.shm.telemetry import MSG_WORDS, TelemetryPublisher

__all__ = ["DISCOVERY", "RingsHost", "with_rings"]

log = logging.getLogger(__name__)

DISCOVERY = "dq-rings.json"


class RingsHost:
    """Creates the three rings, serves them, and tears them down."""

    def __init__(
        self,
        engine: Any,
        data_dir: str | os.PathLike[str],
        *,
        submission_capacity: int = 1024,
        payload_size: int = 4096,
        broadcast_size: int = 1 << 20,
        telemetry_len: int = 256,
        telemetry_interval_s: float = 1.0,
        evict_after_s: float = 10.0,
    ) -> None:
        self.engine = engine
        self.data_dir = Path(data_dir)
        self.sizes = {
            "submission": submission_ring.ring_size(submission_capacity, payload_size),
            "broadcast": broadcast_ring.ring_size(broadcast_size),
            "telemetry": telemetry_ring.ring_size(telemetry_len, MSG_WORDS),
        }
        self._params = (submission_capacity, payload_size, broadcast_size, telemetry_len)
        self.telemetry_interval_s = telemetry_interval_s
        self.evict_after_s = evict_after_s
        self.names: dict[str, str] = {}
        self.maps: dict[str, Any] = {}
        self.drainer: SubmissionDrainer | None = None
        self.events: EventPublisher | None = None
        self.telemetry: TelemetryPublisher | None = None

    def start(self) -> RingsHost:
        capacity, payload, bsize, tlen = self._params
        prefix = shm_prefix(self.data_dir)
        try:
            for ring, size in self.sizes.items():
                self.names[ring], self.maps[ring] = create_shm(prefix, size)
            submission_ring.init_ring(self.maps["submission"], capacity, payload)
            broadcast_ring.init_ring(self.maps["broadcast"], bsize)
            telemetry_ring.init_ring(self.maps["telemetry"], tlen, MSG_WORDS)
            self.drainer = SubmissionDrainer(self.engine, self.maps["submission"]).start()
            self.events = EventPublisher(
                self.engine, self.maps["broadcast"], evict_after_s=self.evict_after_s
            ).start()
            self.telemetry = TelemetryPublisher(
                self.engine, self.maps["telemetry"], interval_s=self.telemetry_interval_s
            ).start()
            self._write_discovery()
        except BaseException:
            self.close()
            raise
        log.info("submission, broadcast and telemetry rings served for %s", self.data_dir)
        return self

    def _write_discovery(self) -> None:
        doc: dict[str, Any] = {"version": 1, "pid": os.getpid()}
        for ring, name in self.names.items():
            doc[ring] = {"shm": name, "size": self.sizes[ring]}
        path = self.data_dir / DISCOVERY
        tmp = path.with_name(f".{DISCOVERY}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)

    def close(self) -> None:
        for part in (self.telemetry, self.events, self.drainer):
            if part is not None:
                part.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.data_dir / DISCOVERY)
        for ring, name in self.names.items():
            unlink_shm(name)
            with contextlib.suppress(BufferError, ValueError):
                self.maps[ring].close()
        self.names.clear()


class _WithRings:
    """The shm server plus the rings host, closed together (the lifespan's one object)."""

    def __init__(self, server: Any, host: RingsHost) -> None:
        self._server = server
        self.rings = host

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)

    def close(self, *args: Any, **kwargs: Any) -> None:
        try:
            self.rings.close()
        finally:
            self._server.close(*args, **kwargs)


def with_rings(server: Any, engine: Any, data_dir: str | os.PathLike[str]) -> Any:
    """Start the three rings beside ``server`` (the command-ring server)."""
    return _WithRings(server, RingsHost(engine, data_dir).start())
