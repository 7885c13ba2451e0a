"""Every module of the client and server packages declares a sorted, real ``__all__``."""

from __future__ import annotations

import importlib

import pytest

from dq import client

#: The modules of issue 4 (other engineers' modules in these packages keep their own).
MODULES = [
    "dq.client", "dq.client._async_client", "dq.client._client", "dq.client._common", "dq.client._http",
    "dq.client._connection", "dq.client._transport", "dq.client._wire", "dq.client.jobs", "dq.client.errors", "dq.client.types",
    "dq.server.app", "dq.cli.main", "dq.cli._remote", "dq.cli.admin",
    "dq.cli.items", "dq.cli.serve", "dq.server.dependencies", "dq.server.errors",
    "dq.server.lifespan", "dq.server.limits", "dq.server.longpoll", "dq.server.metrics",
    "dq.server.routers._common", "dq.server.routers.items", "dq.server.routers.ops",
    "dq.server.routers.queues", "dq.server.runner", "dq.server.schemas", "dq.server.settings",
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
