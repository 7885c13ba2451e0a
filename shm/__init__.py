"""Deadline Queue: the shared-memory rings (docs/shm.md), their server and client sides.

The package itself exports nothing: import from its modules.
"""

__all__: list[str] = []
