"""Amazon SQS's API, served by ``dq serve`` at the root of its port (docs/sqs.md).

``install(app)`` mounts the endpoint (``protocol``) and the SQS layer's state. The
modules, one job each: ``protocol`` (parse, authenticate, dispatch, answer), ``query``
(the older form/XML protocol, translated to the same actions), ``admin``
(queue actions), ``send`` and ``receive`` (message actions), ``messages`` (how a message
is stored in an item; digests), ``queue_attrs`` and ``sidecar`` (queue attributes),
``names`` (URLs and ARNs), ``errors``, ``sigv4``, ``params``, ``batches``, ``moves``
(redrive tasks), ``receives`` (first-receive times), ``context`` (limits, per-request
context).
"""

from __future__ import annotations

from fastapi import FastAPI

from dq.server.sqs.context import SqsState
from dq.server.sqs.protocol import router

__all__ = ["install"]


def install(app: FastAPI) -> None:
    app.state.sqs = SqsState()
    app.include_router(router)
