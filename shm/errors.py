"""The one error tree of the shared-memory package.

Every failure in ``shm/`` is a ``ShmError``. The server never lets one escape into
the engine: a client whose ring breaks the protocol is dropped, the others keep
being served.

    ShmError
    ├── AttachError          the Unix-socket handshake failed (refused, bad reply, wrong uid)
    ├── RingFullError        no free slot (or ring space) before the timeout
    ├── RingTimeout          no response / no progress before the timeout
    ├── RingClosed           the other side went away (server stopped, client dropped)
    ├── ProtocolError        a ring's shared bytes break the protocol (bad head, bad op, ...)
    │   └── MalformedSlot    one command slot's fields are out of range
    └── ValueTooLargeForRing a value or message does not fit the ring's fixed slot size
"""

from __future__ import annotations

__all__ = [
    "AttachError",
    "MalformedSlot",
    "ProtocolError",
    "RingClosed",
    "RingFullError",
    "RingTimeout",
    "ShmError",
    "ValueTooLargeForRing",
]


class ShmError(Exception):
    """Base of every error raised by ``shm/``; ``context`` names ring, slot, offset."""

    def __init__(self, message: str, **context: object) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        if not self.context:
            return self.message
        details = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        return f"{self.message} ({details})"


class AttachError(ShmError):
    """The attach handshake over the Unix socket failed."""


class RingFullError(ShmError):
    """No free slot appeared before the timeout."""


class RingTimeout(ShmError):
    """The other side did not answer before the timeout."""


class RingClosed(ShmError):
    """The ring's peer is gone; the ring must not be used any more."""


class ProtocolError(ShmError):
    """Shared bytes that break the ring protocol (the peer is buggy or hostile)."""


class MalformedSlot(ProtocolError):
    """A command slot whose fields are out of range."""


class ValueTooLargeForRing(ShmError):
    """A value that does not fit a fixed-size slot; send it another way (HTTP)."""
