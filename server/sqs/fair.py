"""Fair queues: ``MessageGroupId`` on a standard queue names the tenant, as in SQS.

SQS made every standard queue fair in 2025, with nothing to configure: a message's
``MessageGroupId`` names its tenant, and a tenant with a backlog no longer holds up the
others' messages. In dq that is a queue's ``fair`` rule (``docs/delivery.md``): dequeue
serves the groups with due items in turn, whoever dequeues. How the turns go is the
engine's rule; this module only turns it on.

When: at the first message with a group sent to a standard queue, not at creation.
A standard queue whose messages carry no group (Celery's, most SQS code) keeps
dequeue's plain walk, which costs less than the fair one, and a queue created through
the native API and fed through SQS becomes fair the way an SQS user expects — by
sending groups. It is done once per queue and remembered in the queue's SQS sidecar
(``Sidecar.fair_since``): an operator who turns ``fair`` off afterwards is not
overruled by the next grouped send.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from dq.server.sqs.context import Ctx
from dq.server.sqs.errors import from_storage
from dq.storage.errors import StorageError

__all__ = ["make_fair"]


async def make_fair(ctx: Ctx, name: str) -> None:
    """Turn on the ``fair`` rule of standard queue ``name``, unless the SQS layer did so
    before; the config and the sidecar are durable before the send goes on."""
    engine = ctx.engine
    sidecars = ctx.state.sidecars
    try:
        async with ctx.state.admin_lock:  # config and sidecar are read, changed, written
            sidecar = sidecars.load(engine, name)
            if sidecar.fair_since is not None:
                return  # another send did it meanwhile
            config = engine.get_queue(name)
            if not config.fair:
                await asyncio.to_thread(engine.put_queue, name, replace(config, fair=True))
            sidecar.fair_since = engine.now() // 1000
            await asyncio.to_thread(sidecars.save, engine, name, sidecar)
    except StorageError as exc:
        raise from_storage(exc, name) from None
    except FileNotFoundError:  # deleted meanwhile: the send finds no queue either
        return
