"""A follower's pull on the HTTP fast path (``server/hot_routes.py``).

Every replicated write costs the leader one pull answer and one pull request per
follower, and through the FastAPI route each costs several hundred µs of the event
loop (``bench/NOTES.md``, "Replication: three members beside one node"). Served here,
a pull that goes well is answered with the route's own bytes, refusals included
(``tests/replication/test_routes.py`` compares them); a body the schema refuses goes to
the route.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import TypeAdapter

from dq.server.errors import error_json, header_lines, storage_error_reply
from dq.server.replication.leader import Refused, Replicator
from dq.server.replication.routes import PullRequest, not_leader

__all__ = ["PULL_REQUEST", "answer_pull"]

PULL_REQUEST = TypeAdapter(PullRequest)


class Responder(Protocol):
    """The part of the fast path's ``Responder`` (``server/hot_routes.py``) a pull uses."""

    def reply(
        self, status: int, body: bytes, headers: bytes, content_type: bytes = b""
    ) -> None: ...


_OCTETS = b"application/octet-stream"


async def answer_pull(
    rep: Replicator, request: PullRequest, responder: Responder, state: Any
) -> None:
    try:
        pulled = await rep.pull(request.node, request.epoch, request.after, request.wait_ms)
    except Refused as exc:  # worded as the route words it (``routes._refusal``)
        if exc.code == "not_leader":
            status, body, extra = storage_error_reply(not_leader(state), "replica pull")
            responder.reply(status, body, header_lines(extra))
        else:
            responder.reply(409, error_json(exc.code, exc.message), b"")
        return
    lines = b"x-dq-epoch: %d\r\nx-dq-commit: %d\r\nx-dq-lsn: %d\r\n" % (
        pulled.epoch,
        pulled.commit_lsn,
        pulled.last_lsn,
    )
    responder.reply(200, pulled.body, lines, _OCTETS)
