"""Every module of the client and server packages declares a sorted, real ``__all__``."""

from __future__ import annotations

import importlib

import pytest

import client

#: The modules of issue 4 (other engineers' modules in these packages keep their own).
MODULES = [
    "client", "client._async_client", "client._client", "client._common", "client._http",
    "client._transport", "client._wire", "client.consumer", "client.errors", "client.types",
    "server.app", "server.cli", "server.commands._remote", "server.commands.admin",
    "server.commands.items", "server.commands.serve", "server.dependencies", "server.errors",
    "server.lifespan", "server.limits", "server.longpoll", "server.metrics",
    "server.routers._common", "server.routers.items", "server.routers.ops",
    "server.routers.queues", "server.runner", "server.schemas", "server.settings",
]  # fmt: skip


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions: the order ruff's RUF022 keeps."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_real(name: str) -> None:
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported, key=_isort_key), f"{name}.__all__ is not sorted"
    assert all(hasattr(module, n) for n in exported)


def test_client_exports_the_error_tree() -> None:
    assert issubclass(client.StaleReceipt, client.Conflict)
    assert issubclass(client.Conflict, client.ServerError)
    assert issubclass(client.ServerError, client.ClientError)
    assert issubclass(client.TransportError, client.ClientError)
