"""A stand-in for the coordinator's membership calls (etcd's member add and remove) that
always agrees and records what it was asked, in order, for the tests that give a
replicator or a server a coordinator without running etcd."""

from __future__ import annotations

__all__ = ["Members"]


class Members:
    """A coordinator that always agrees, recording the order of its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def add_member(self, node: str) -> bool:
        self.calls.append(("add", node))
        return True

    async def remove_member(self, node: str) -> bool:
        self.calls.append(("remove", node))
        return True
