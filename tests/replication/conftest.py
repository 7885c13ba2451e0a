from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.replication.cluster import Cluster, started_cluster
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


@pytest.fixture
def group_env() -> dict[str, str]:
    """Settings added to every member's environment in ``group`` (a test module that
    needs others defines its own ``group_env``)."""
    return {}


@pytest.fixture
def group(
    tmp_path: Path, etcd: EtcdServer, cluster: str, group_env: dict[str, str]
) -> Iterator[Cluster]:
    """A replica group of three ``dq serve`` members on the module's etcd
    (``tests/replication/cluster.py``), started for the test and killed after."""
    with started_cluster(tmp_path, etcd, cluster, group_env) as made:
        yield made
