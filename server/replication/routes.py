"""The replication routes a leader serves to its followers, and the cluster status.

- ``POST /v1/replica/pull``: acknowledge (``after``) and fetch frames; long-polls up to
  ``wait_ms`` (at most 1000) when there are none. 200 body: concatenated frames
  (``dq.storage.replication.encode_frame``), headers ``X-DQ-Epoch``, ``X-DQ-Commit``
  (commit lsn) and ``X-DQ-Lsn`` (last lsn shipped).
- ``POST /v1/replica/snapshot``: a tar of every queue plus ``snapshot.json``; the follower
  is attached at the snapshot's ``lsn`` (``server/replication/snapshot_stream.py``).
- ``GET /v1/cluster``: this node's role, epoch and leader, and, on the leader, lsn,
  commit lsn, sync set and followers.

Both replica routes answer 409 ``resync_needed`` (start over from a snapshot) or
``stale_leader`` (the follower has seen a newer epoch; this leader steps down), 421
``not_leader`` on a node that does not lead, 404 on a server without replication. The
wire is described in docs/replication.md. The routes find the node's state on
``app.state``: ``node`` (the role machine, ``server/replication/node.py``; absent on a
single node) and ``replicator`` (a ``Replicator`` while this node leads).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field

from dq.server.dependencies import service_of
from dq.server.errors import ApiError
from dq.server.replication.leader import MAX_WAIT_MS, Refused, Replicator
from dq.server.replication.snapshot_stream import take_snapshot, tar_chunks
from dq.server.routers._common import ERRORS, json_response
from dq.server.schemas import ErrorBody
from dq.storage.replication import NotLeader

__all__ = ["ClusterDoc", "PullRequest", "SnapshotRequest", "not_leader", "router"]

router = APIRouter(prefix="/v1", tags=["replication"])

#: what DQ_NODE may be: a name without "/" (it is part of etcd keys)
_NODE_NAME = r"^[^/\s]{1,255}$"


class PullRequest(BaseModel):
    node: str = Field(pattern=_NODE_NAME, description="the follower's member name")
    epoch: int = Field(ge=0, description="the highest epoch the follower has seen")
    after: int = Field(
        ge=0, description="the highest lsn the follower has applied and fsynced (the ack)"
    )
    wait_ms: int = Field(
        default=0, ge=0, description=f"wait for frames this long when none (at most {MAX_WAIT_MS})"
    )


class SnapshotRequest(BaseModel):
    node: str = Field(pattern=_NODE_NAME, description="the follower's member name")
    epoch: int = Field(ge=0, description="the highest epoch the follower has seen")


class LeaderRef(BaseModel):
    node: str
    url: str


class FollowerDoc(BaseModel):
    acked: int
    in_sync: bool


class ReplicaError(BaseModel):
    code: str = Field(
        description="stale_leader, not_leader, unreachable, corruption, protocol, "
        "apply_failed, resync_failed, refused, error or stalled"
    )
    message: str
    at: float = Field(description="when, in seconds since the epoch (Unix time)")


class ReplicaDoc(BaseModel):
    state: str = Field(description="resyncing, streaming or stopped")
    resyncs: int = Field(description="snapshots installed since this node started")
    last_error: ReplicaError | None = Field(
        description="the last trouble of the pull loop (it retries by itself)"
    )


class ClusterDoc(BaseModel):
    node: str
    role: str = Field(description="leader, follower, candidate or single")
    epoch: int
    leader: LeaderRef | None
    lsn: int
    commit_lsn: int
    sync: list[str]
    followers: dict[str, FollowerDoc]
    replica: ReplicaDoc | None = Field(
        default=None, description="on a follower: how its copy keeps up with the leader"
    )


_REFUSALS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "Replication is off on this server"},
    409: {
        "model": ErrorBody,
        "description": "resync_needed (fetch a snapshot) or stale_leader (newer epoch seen)",
    },
    421: {"model": ErrorBody, "description": "This node is not the leader"},
}
_AUTH: dict[int | str, dict[str, Any]] = {s: ERRORS[s] for s in (400, 401, 403, 422)}


def _not_leader(request: Request) -> NotLeader:
    return not_leader(request.app.state)


def not_leader(state: Any) -> NotLeader:
    """The refusal of a node that does not lead, naming the leader the node knows."""
    return NotLeader(
        "this node does not lead the replica group: replicate from the leader",
        leader=_leader_url(state),
    )


def _leader_url(state: Any) -> str | None:
    node = getattr(state, "node", None)
    if node is None:
        return None
    leader = node.describe().get("leader")
    return leader.get("url") if isinstance(leader, dict) else None


def _replicator(request: Request) -> Replicator:
    """This node's replicator, or the refusal a follower's pull gets."""
    service_of(request)  # 503 while starting or stopping
    if getattr(request.app.state, "node", None) is None:
        raise ApiError(404, "not_found", "replication is off on this server (DQ_ETCD is empty)")
    rep: Replicator | None = getattr(request.app.state, "replicator", None)
    if rep is None or rep.closed:
        raise _not_leader(request)
    return rep


def _refusal(request: Request, exc: Refused) -> Exception:
    if exc.code == "not_leader":
        return _not_leader(request)
    return ApiError(409, exc.code, exc.message)


@router.post(
    "/replica/pull",
    response_class=Response,
    responses={
        200: {
            "content": {"application/octet-stream": {}},
            "description": "Frames after `after` (maybe none)",
        },
        **_REFUSALS,
        **_AUTH,
        503: ERRORS[503],
    },
    summary="A follower acknowledges and fetches frames",
)
async def pull(body: PullRequest, request: Request) -> Response:
    rep = _replicator(request)
    try:
        pulled = await rep.pull(body.node, body.epoch, body.after, body.wait_ms)
    except Refused as exc:
        raise _refusal(request, exc) from None
    return Response(
        pulled.body,
        media_type="application/octet-stream",
        headers={
            "X-DQ-Epoch": str(pulled.epoch),
            "X-DQ-Commit": str(pulled.commit_lsn),
            "X-DQ-Lsn": str(pulled.last_lsn),
        },
    )


@router.post(
    "/replica/snapshot",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-tar": {}},
            "description": "snapshot.json, then queues/<queue>/... of every queue",
        },
        **_REFUSALS,
        **_AUTH,
        503: ERRORS[503],
        507: ERRORS[507],
    },
    summary="A follower fetches a copy of every queue to start from",
)
async def snapshot(body: SnapshotRequest, request: Request) -> StreamingResponse:
    rep = _replicator(request)
    service = service_of(request)
    try:
        rep.check_epoch(body.epoch)
        start = rep.attach(body.node)
    except Refused as exc:
        raise _refusal(request, exc) from None
    attached_at = rep.attached_at(body.node)

    def release() -> None:
        if attached_at is not None:
            rep.detach_unless_counted(body.node, attached_at)

    try:
        root = await take_snapshot(service.engine, service.settings.data_dir, rep.epoch, start)
    except BaseException:
        release()
        raise
    return StreamingResponse(tar_chunks(root, release), media_type="application/x-tar")


@router.get(
    "/cluster",
    response_model=ClusterDoc,
    responses={**_AUTH, 503: ERRORS[503]},
    summary="This node's role, epoch and leader; on the leader, its followers",
)
async def cluster(request: Request) -> Response:
    service_of(request)
    node = getattr(request.app.state, "node", None)
    doc: dict[str, Any]
    if node is None:
        doc = {
            "node": service_of(request).settings.node_name,
            "role": "single",
            "epoch": 0,
            "leader": None,
        }
    else:
        doc = dict(node.describe())
    doc.setdefault("lsn", 0)
    doc.setdefault("commit_lsn", 0)
    doc.setdefault("sync", [])
    doc.setdefault("followers", {})
    rep: Replicator | None = getattr(request.app.state, "replicator", None)
    if node is not None and rep is not None and not rep.closed and doc["role"] == "leader":
        doc.update(rep.status())
    return json_response(doc)
