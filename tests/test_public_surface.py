"""Every module of every ``dq`` package declares a sorted, real ``__all__``.

The modules are found by walking the packages, so a new module is covered the day it
lands. C extensions (``dq.shm._atomics``) are left out: their names are declared in a
``.pyi`` stub, checked by mypy.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import pkgutil

import pytest

from dq import client

PACKAGES = ("dq.server", "dq.storage", "dq.shm", "dq.client", "dq.cli", "dq.pipeline")


def _modules() -> list[str]:
    found = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        found.append(name)
        for info in pkgutil.walk_packages(package.__path__, name + "."):
            spec = importlib.util.find_spec(info.name)
            if spec is not None and isinstance(
                spec.loader, importlib.machinery.ExtensionFileLoader
            ):
                continue
            found.append(info.name)
    return sorted(found)


MODULES = _modules()


def test_the_walk_sees_every_package() -> None:
    assert {"dq.storage.engine", "dq.server.routers.consumers", "dq.cli.main"} <= set(MODULES)
    assert "dq.pipeline.jobs.event_counts" in MODULES
    assert "dq.shm._atomics" not in MODULES


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions: the order ruff's RUF022 keeps."""
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_sorted_and_real(name: str) -> None:
    module = importlib.import_module(name)
    assert hasattr(module, "__all__"), f"{name} declares no __all__"
    exported = list(module.__all__)
    assert exported == sorted(exported, key=_isort_key), f"{name}.__all__ is not sorted"
    assert all(hasattr(module, n) for n in exported)


def test_client_exports_the_error_tree() -> None:
    assert issubclass(client.StaleReceipt, client.Conflict)
    assert issubclass(client.Conflict, client.ServerError)
    assert issubclass(client.ServerError, client.ClientError)
    assert issubclass(client.TransportError, client.ClientError)
