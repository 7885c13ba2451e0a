"""The app's lifespan: it owns every resource the routes use, opens and closes them.

Order on startup: open the engine (in a thread: recovery reads files) → open the
consumer-group log (``server/consumer_groups.py``, its lease keep-alive thread) and the
keyed-batch memory (``server/keyed_batches.py``) → publish the ``Service`` on
``app.state`` (routes reach it through ``server/dependencies.py``) → start the periodic
``expire_leases`` task and the dashboard's history sampler (``server/history.py``) →
join the replica group if ``settings.etcd`` is set (``server/replication/member.py``:
the engine refuses writes until etcd has made this node leader) → start the scheduler,
the one timer of every schedule (``storage/scheduler.py``: it fires only while the engine
takes writes, so only a replica group's leader fires) → start the
shared-memory server and its rings if ``settings.shm`` (the default;
``shm/server.py``, ``shm/rings_host.py``; a data directory where they cannot run, e.g. a
path too long for the attach socket, is served over HTTP alone, with a warning).
Shutdown runs it backwards (a leader resigns first, so a sync member takes over at once)
and closes the engine last (closing syncs). Invariant: an
engine handed to ``create_app`` belongs to the caller and is not closed here; one the
lifespan opened always is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from dq.server.completions import Completions
from dq.server.consumer_groups import ConsumerGroups
from dq.server.dependencies import Service
from dq.server.hot_routes import HotRoutes
from dq.server.keyed_batches import IdempotentBatches
from dq.server.longpoll import LongPoll
from dq.storage.errors import StorageError
from dq.storage.itemops import ItemOps
from dq.storage.scheduler import Scheduler

if TYPE_CHECKING:
    from fastapi import FastAPI

    from dq.server.settings import Settings
    from dq.storage import Engine
    from dq.storage.syncer import InlineCommits

__all__ = ["make_lifespan", "open_consumer_groups", "open_engine", "open_keyed_batches"]

logger = logging.getLogger(__name__)

Lifespan = Callable[["FastAPI"], contextlib.AbstractAsyncContextManager[None]]


def open_engine(settings: Settings) -> Engine:
    from dq.storage import Engine, EngineConfig

    config = EngineConfig(
        fsync=settings.fsync,
        fsync_interval_ms=settings.fsync_interval_ms,
        max_value_bytes=settings.max_value_bytes,
        max_batch=settings.max_batch,
        memseg_bytes=settings.memseg_bytes,
    )
    return Engine.open(settings.data_dir, config)


async def _expire_forever(engine: Engine, interval_s: float) -> None:
    """Give expired leases back even when nobody dequeues (their items become due)."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            await asyncio.to_thread(engine.expire_leases)
        except StorageError as exc:
            logger.warning("lease expiry failed: %s", exc)


def _local_url(settings: Settings) -> str:
    """The HTTP address a local process reaches this server at (told to shm clients)."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "", "::") else settings.host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = "https" if settings.tls_cert else "http"
    return f"{scheme}://{host}:{settings.port}"


def _start_shm(engine: Engine, settings: Settings, ops: ItemOps) -> Any:
    """The command-ring server plus the submission, broadcast and telemetry rings
    (docs/shm.md); None if shared memory cannot be served here."""
    from dq.shm.errors import ShmError
    from dq.shm.rings_host import with_rings
    from dq.shm.server import ShmServer

    try:
        server = ShmServer(
            engine,
            settings.data_dir,
            http_url=_local_url(settings),
            max_clients=settings.shm_max_clients,
            spin_us=settings.shm_spin_us,
            max_wait_ms=settings.max_wait_ms,
            ops=ops,
        ).start()
    except (ShmError, OSError) as exc:
        logger.warning("shared memory not served (HTTP only): %s", exc)
        return None
    try:
        return with_rings(server, engine, settings.data_dir)
    except BaseException:
        server.close()
        raise


def open_consumer_groups(engine: Engine, settings: Settings) -> ConsumerGroups:
    """Every consumer's delivery log, its lease keep-alive thread running."""
    groups = ConsumerGroups(
        engine, max_batch=settings.max_batch, max_log_bytes=settings.consumer_max_log_bytes
    )
    groups.start()
    return groups


def open_keyed_batches(engine: Engine, settings: Settings) -> IdempotentBatches:
    return IdempotentBatches(
        engine,
        max_keys=settings.keyed_batch_max_keys,
        max_bytes=settings.keyed_batch_max_bytes,
    )


def commit_on_loop(
    engine: Engine, settings: Settings, loop: asyncio.AbstractEventLoop
) -> InlineCommits | None:
    """The loop commits the writes it serves itself, once per turn (``storage/syncer.py``),
    when the engine syncs every write and ``inline_commit`` is on."""
    syncer = engine.syncer
    if not settings.inline_commit or syncer is None or syncer.mode != "always":
        return None
    return syncer.commit_inline(loop.call_soon)


def make_lifespan(settings: Settings, engine: Engine | None) -> Lifespan:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = engine is None
        opened = await asyncio.to_thread(open_engine, settings) if engine is None else engine
        loop = asyncio.get_running_loop()
        groups = open_consumer_groups(opened, settings)
        completions = Completions(loop)
        completions.bind_thread()
        inline = commit_on_loop(opened, settings, loop)
        # the item operations of both transports, with one set of long-poll waiters: a
        # drain ends the waits of both alike
        ops = ItemOps(opened, max_wait_ms=settings.max_wait_ms)
        app.state.service = service = Service(
            opened,
            settings,
            app.state.metrics,
            ops,
            LongPoll(opened, loop, ops.waits),
            completions,
            groups,
            open_keyed_batches(opened, settings),
            inline,
        )
        app.state.fast_path.hot = HotRoutes(service, app.state)
        if not getattr(app.state, "engine_watched", False):
            app.state.metrics.watch_engine(
                lambda: _current_engine(app), settings.metrics_max_queues
            )
            app.state.engine_watched = True
        expiry = asyncio.create_task(
            _expire_forever(opened, settings.expire_interval_ms / 1000.0), name="dq-expire-leases"
        )
        history = asyncio.create_task(app.state.history.run(opened), name="dq-history")
        app.state.started_at = time.time()
        opened.min_every_ms = settings.schedule_min_every_ms
        shm: Any = None
        node: Any = None
        scheduler: Scheduler | None = None
        try:
            if settings.replicated:
                from dq.server.replication.member import open_member

                node = await open_member(app.state, opened, settings)
                logger.info(
                    "replica group %s: member %s at %s (etcd %s)",
                    settings.cluster,
                    settings.node_name,
                    settings.public_url,
                    settings.etcd,
                )
            # after the replica group has set the engine's role: a member never fires
            # before it leads
            scheduler = app.state.scheduler = Scheduler(opened).start()
            if settings.shm:
                shm = await asyncio.to_thread(_start_shm, opened, settings, ops)
                app.state.shm = shm
                if shm is not None:
                    logger.info("shared-memory server started")
            logger.info("serving data dir %s (fsync=%s)", settings.data_dir, settings.fsync)
            yield
        finally:
            if scheduler is not None:
                app.state.scheduler = None
                await asyncio.to_thread(scheduler.stop)
            if node is not None:
                from dq.server.replication.member import close_member

                await close_member(app.state, node)
            service.longpoll.drain()
            for task in (expiry, history):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if shm is not None:
                app.state.shm = None
                await asyncio.to_thread(shm.close)
            await asyncio.to_thread(groups.close)
            if inline is not None:
                inline.close()
            app.state.fast_path.hot = None
            app.state.service = None
            if owned:
                await asyncio.to_thread(opened.close)
                logger.info("engine closed")

    return lifespan


def _current_engine(app: FastAPI) -> Engine | None:
    """The engine of the app's current lifespan, for the scrape-time collector."""
    service: Service | None = getattr(app.state, "service", None)
    return None if service is None else service.engine
