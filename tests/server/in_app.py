"""The app in the test's own process: its lifespan (engine, scheduler, history …) runs
around a client that reaches it through httpx's ASGI transport, with no socket and no
subprocess, for tests that only need the routes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
from fastapi import FastAPI

from dq.server.app import create_app
from dq.server.settings import Settings

__all__ = ["Call", "app_client", "run_in_app"]

#: what a test does with the client; its answer is ``run_in_app``'s
Call = Callable[[httpx.AsyncClient], Awaitable[object]]


@contextlib.asynccontextmanager
async def app_client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` while its lifespan runs (started before, stopped after)."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://dq") as http:
            yield http


def run_in_app(tmp_path: Path, call: Call, **settings: object) -> object:
    """``call`` against an app on ``tmp_path/d`` (``fsync never``, then ``settings``)."""
    app = create_app(Settings(data_dir=str(tmp_path / "d"), fsync="never").replace(**settings))

    async def go() -> object:
        async with app_client(app) as http:
            return await call(http)

    return asyncio.run(go())
