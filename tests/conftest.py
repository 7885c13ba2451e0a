"""The test tiers (see ``tests/tiers.py``): marking integration tests, guarding the rest.

Every test that uses a fixture declared with ``starts_servers`` is marked ``integration``
at collection, before ``-m "not integration"`` deselects it. While a test *without* the
marker sets up, runs and tears down, the guard refuses any subprocess or TCP server, and
the test fails saying what it started and from where: mark the test (or its module, or
the fixture that starts the server) ``integration``.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest

from tests.tiers import INTEGRATION, Guard, uses_servers

#: ``tests/test_tiers.py`` runs pytest on sample tests to check the guard.
pytest_plugins = ["pytester"]

GUARD = pytest.StashKey[Guard]()


def pytest_configure(config: pytest.Config) -> None:
    guard = Guard()
    guard.install()
    config.stash[GUARD] = guard


def pytest_unconfigure(config: pytest.Config) -> None:
    if GUARD in config.stash:
        config.stash[GUARD].uninstall()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker(INTEGRATION) is not None:
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        funcs = [d.func for defs in info.name2fixturedefs.values() for d in defs]
        if uses_servers(funcs):
            item.add_marker(INTEGRATION)


def _guarded(item: pytest.Item) -> Generator[None, object, object]:
    armed = item.get_closest_marker(INTEGRATION) is None
    with item.config.stash[GUARD].arming(armed) as starts:
        try:
            return (yield)
        finally:
            if starts:
                raise pytest.fail.Exception(
                    "this test is not marked integration but started "
                    + "; and ".join(map(str, starts))
                    + "\nmark it (or its module, or the fixture that starts it) integration:"
                    " see tests/tiers.py",
                    pytrace=False,
                ) from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _guarded(item))
