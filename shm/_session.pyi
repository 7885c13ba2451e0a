"""Types of the compiled session loop of a command ring (shm/_session.c)."""

from collections.abc import Callable

from typing_extensions import Buffer

from dq.shm.command_handler import CommandHandler

class RingSession:
    """The server's side of one command ring (docs/shm.md): writes the ring's header."""

    def __init__(
        self,
        buffer: Buffer,
        capacity: int,
        handler: CommandHandler,
        statuses: dict[str, int],
        bound: bool = False,
        watch: Callable[[int], object] | None = None,
        groups: bool = False,
    ) -> None: ...
    @property
    def tail(self) -> int: ...
    @property
    def bound(self) -> bool: ...
    def serve(self, wakes: bool = True, spin_us: float = 0.0) -> None: ...
    def stop(self) -> None: ...
    def close(self) -> None: ...
    def later(self, fn: Callable[[], None], /) -> None: ...
