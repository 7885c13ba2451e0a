from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from tests.replication.etcd_server import EtcdServer, running_etcd
from tests.tiers import starts_servers

_clusters = itertools.count(1)


@pytest.fixture(scope="module")
@starts_servers
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd for the module; each test works under its own cluster name."""
    with running_etcd(tmp_path_factory.mktemp("etcd") / "data") as server:
        yield server


@pytest.fixture
def cluster() -> str:
    return f"t{next(_clusters)}"
