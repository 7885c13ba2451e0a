"""What ``server/protocol.py`` uses of uvicorn beyond its public ``Config`` and ``Server``,
named one by one, so that an upgrade that changes any of it fails here first.

The protocol is ours (httptools' parser, the ASGI interface to the app); uvicorn's
``Server`` runs it — sockets, TLS, the lifespan, signals, the graceful drain — and
builds one protocol object per connection. That construction is not part of uvicorn's
documented interface, so ``pyproject.toml`` pins uvicorn's minor version, and this
test reads uvicorn's own source for each thing the protocol relies on.
"""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import uvicorn
import uvicorn.server
from fastapi import FastAPI
from packaging.requirements import Requirement
from packaging.version import Version

from dq.server.hot_routes import FastPathSlot
from dq.server.protocol import DqHttpProtocol, protocol_for
from dq.server.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
#: uvicorn's ``server`` module as written (the test tiers wrap ``Server.startup``)
SERVER_SOURCE = Path(inspect.getfile(uvicorn.server)).read_text()


def _method(name: str) -> str:
    """The source of ``Server.<name>`` in uvicorn's file."""
    match = re.search(
        rf"\n    (async )?def {name}\(.*?(?=\n    (async )?def |\Z)", SERVER_SOURCE, re.S
    )
    assert match is not None, name
    return match.group(0)


def _pin() -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (spec,) = [d for d in project["dependencies"] if Requirement(d).name == "uvicorn"]
    return Requirement(spec)


def test_uvicorn_is_pinned_to_the_minor_version_these_names_were_read_from() -> None:
    pin = _pin()
    installed = Version(uvicorn.__version__)
    assert pin.specifier.contains(installed), (pin, installed)
    # one minor version only: the next one may change what is named below
    assert not pin.specifier.contains(f"{installed.major}.{installed.minor + 1}.0")


def test_the_server_builds_each_connection_with_these_keywords() -> None:
    """``Server.startup`` calls ``config.http_protocol_class(config=..., server_state=...,
    app_state=..., _loop=...)``; ``DqHttpProtocol.__init__`` takes exactly those."""
    source = _method("startup")
    call = re.search(r"config\.http_protocol_class\((.*?)\)", source, re.S)
    assert call is not None
    keywords = set(re.findall(r"(\w+)=", call.group(1)))
    assert keywords == {"config", "server_state", "app_state", "_loop"}
    assert set(inspect.signature(DqHttpProtocol.__init__).parameters) - {"self"} == keywords


def test_the_server_state_holds_what_the_protocol_reads() -> None:
    """``connections`` (the connection cap, the graceful drain), ``tasks`` (the app's
    requests the drain waits for), ``default_headers`` (the ``date`` line, refreshed by
    ``Server.on_tick``) and ``total_requests``."""
    state = uvicorn.server.ServerState()
    assert isinstance(state.connections, set) and isinstance(state.tasks, set)
    assert isinstance(state.default_headers, list) and state.total_requests == 0
    assert "self.server_state.default_headers =" in _method("on_tick")


def test_the_graceful_drain_calls_each_connections_shutdown() -> None:
    assert "connection.shutdown()" in _method("shutdown")
    assert "server_state.connections" in _method("_wait_tasks_to_complete")
    assert callable(DqHttpProtocol.shutdown)


def test_config_takes_the_protocol_class_as_is(tmp_path: Path) -> None:
    app = FastAPI()
    app.state.fast_path = FastPathSlot()
    cls = protocol_for(app, Settings(data_dir=str(tmp_path)))
    config = uvicorn.Config(app, http=cls, lifespan="off")
    config.load()
    assert config.http_protocol_class is cls
    assert (config.root_path, config.timeout_keep_alive) == ("", 5)
