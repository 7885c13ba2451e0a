"""What an SQS action runs with: the service, the caller, the limits, the SQS-side state.

``Limits`` holds SQS's own limits (10 entries a batch, 256 KiB a message, 15 minutes
of delay, 20 s of long poll, 10 message attributes) unless the server runs with
``DQ_SQS_RELAXED=1``, which lifts each to what dq itself allows (docs/sqs.md, "Limits").
``SqsState`` is created once per app and holds what the SQS layer keeps beside the
engine: per-queue attribute files, first-receive times, FIFO receive attempts, and
message move tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dq.server.sqs.attempts import ReceiveAttempts
from dq.server.sqs.moves import MoveTasks
from dq.server.sqs.names import queue_arn, queue_url
from dq.server.sqs.receives import FirstReceives
from dq.server.sqs.sidecar import SidecarStore

if TYPE_CHECKING:
    from dq.server.dependencies import Service
    from dq.server.settings import Settings
    from dq.storage import Engine

__all__ = ["Ctx", "Limits", "SqsState"]

KIB = 1024
#: SQS's largest visibility timeout, 12 hours: also dq's longest lease.
MAX_VISIBILITY_S = 12 * 3600
#: The longest delay ``DQ_SQS_RELAXED`` allows (about 68 years; deadlines are 48-bit ms).
RELAXED_MAX_DELAY_S = 2**31 - 1


@dataclass(frozen=True, slots=True)
class Limits:
    relaxed: bool
    batch_entries: int
    message_bytes: int
    batch_bytes: int
    max_delay_s: int
    max_wait_s: int
    max_receive: int
    max_retention_s: int

    @classmethod
    def of(cls, settings: Settings) -> Limits:
        if not settings.sqs_relaxed:
            return cls(False, 10, 256 * KIB, 256 * KIB, 900, 20, 10, 14 * 86400)
        return cls(
            True,
            settings.max_batch,
            settings.max_value_bytes,
            settings.body_limit,
            RELAXED_MAX_DELAY_S,
            settings.max_wait_ms // 1000,
            settings.max_batch,
            RELAXED_MAX_DELAY_S,
        )


@dataclass(slots=True)
class SqsState:
    sidecars: SidecarStore = field(default_factory=SidecarStore)
    receives: FirstReceives = field(default_factory=FirstReceives)
    attempts: ReceiveAttempts = field(default_factory=ReceiveAttempts)
    moves: MoveTasks = field(default_factory=MoveTasks)
    #: serializes queue admin writes (read-modify-write of config and sidecar)
    admin_lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass(slots=True)
class Ctx:
    service: Service
    state: SqsState
    limits: Limits
    #: ``scheme://host:port`` as the client addressed us
    base: str
    account: str
    region: str
    #: the access key id that signed the request (or the account without auth)
    sender: str
    #: completes when the client has gone (ends a long poll early)
    gone: Callable[[], Awaitable[object]]

    @property
    def engine(self) -> Engine:
        return self.service.engine

    def url(self, name: str) -> str:
        return queue_url(self.base, self.account, name)

    def arn(self, name: str) -> str:
        return queue_arn(self.region, self.account, name)
