"""The JSON-gateway client against a real etcd: key-value calls, transactions, leases,
endpoint failover and errors."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from dq.server.replication.etcd import (
    EtcdClient,
    EtcdError,
    compare_create,
    compare_mod,
    compare_version,
    delete_op,
    parse_endpoints,
    put_op,
    range_op,
)
from tests.replication.etcd_server import EtcdServer
from tests.server.live import free_port


@pytest.fixture
def client(etcd: EtcdServer) -> Iterator[EtcdClient]:
    with EtcdClient(etcd.url, timeout_s=2.0) as c:
        yield c


def test_put_get_range_delete(client: EtcdClient, cluster: str) -> None:
    first = client.put(f"/{cluster}/a", "1")
    second = client.put(f"/{cluster}/b", json.dumps({"x": 2}))
    client.put(f"/{cluster}c", "outside the prefix")
    assert second == first + 1
    kv = client.get(f"/{cluster}/a")
    assert kv is not None
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (
        f"/{cluster}/a",
        b"1",
        first,
        first,
        1,
        0,
    )
    again = client.put(f"/{cluster}/a", b"\x00\xff binary")
    kv = client.get(f"/{cluster}/a")
    assert kv is not None and kv.value == b"\x00\xff binary"
    assert (kv.create_revision, kv.mod_revision, kv.version) == (first, again, 2)
    found = client.range(f"/{cluster}/", prefix=True)
    assert [k.key for k in found.kvs] == [f"/{cluster}/a", f"/{cluster}/b"]
    assert found.kvs[1].json() == {"x": 2}
    assert found.revision >= again
    assert client.get(f"/{cluster}/none") is None
    assert client.delete(f"/{cluster}/", prefix=True) == 2
    assert client.range(f"/{cluster}/", prefix=True).kvs == ()
    assert client.get(f"/{cluster}c") is not None


def test_txn_branches(client: EtcdClient, cluster: str) -> None:
    key = f"/{cluster}/k"
    won = client.txn([compare_create(key, 0)], [put_op(key, "first")], [range_op(key)])
    assert won.succeeded and won.ranges == ()
    kv = client.get(key)
    assert kv is not None and kv.create_revision == won.revision
    lost = client.txn([compare_create(key, 0)], [put_op(key, "second")], [range_op(key)])
    assert not lost.succeeded
    assert lost.ranges[0].first() == kv
    stale = client.txn([compare_mod(key, kv.mod_revision - 1)], [put_op(key, "x")])
    assert not stale.succeeded
    fresh = client.txn(
        [compare_mod(key, kv.mod_revision), compare_version(key, 1)],
        [put_op(key, "third"), range_op(key)],
    )
    assert fresh.succeeded and fresh.ranges[0].kvs[0].value == b"third"
    gone = client.txn([compare_version(key, 2)], [delete_op(key)])
    assert gone.succeeded and client.get(key) is None
    assert client.txn([compare_version(key, 0)]).succeeded


def test_lease_keys_go_with_the_lease(client: EtcdClient, cluster: str) -> None:
    lease = client.lease_grant(5)
    assert lease.id != 0 and lease.ttl == 5
    client.put(f"/{cluster}/mine", "x", lease.id)
    kv = client.get(f"/{cluster}/mine")
    assert kv is not None and kv.lease == lease.id
    assert 0 < client.lease_keepalive(lease.id) <= 5
    assert client.lease_revoke(lease.id) is True
    assert client.get(f"/{cluster}/mine") is None
    assert client.lease_keepalive(lease.id) == 0
    assert client.lease_revoke(lease.id) is False


def test_lease_expires_without_keepalive(client: EtcdClient, cluster: str) -> None:
    lease = client.lease_grant(1)
    client.put(f"/{cluster}/short", "x", lease.id)
    give_up = time.monotonic() + 10
    while client.get(f"/{cluster}/short") is not None:
        assert time.monotonic() < give_up, "a 1 s lease outlived 10 s"
        time.sleep(0.1)
    assert client.lease_keepalive(lease.id) == 0


def test_error_names_endpoint_and_code(client: EtcdClient, etcd: EtcdServer) -> None:
    with pytest.raises(EtcdError) as info:
        client.put("/x", "y", lease=12345)  # no such lease
    assert info.value.endpoint == etcd.url
    assert info.value.code == 5
    assert etcd.url in str(info.value) and "lease not found" in str(info.value)


def test_unreachable_endpoints_are_skipped(etcd: EtcdServer, cluster: str) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    with EtcdClient(f"{dead}, {etcd.url}", timeout_s=1.0) as client:
        client.put(f"/{cluster}/k", "v")
        assert client.endpoints[client._current] == etcd.url
        kv = client.get(f"/{cluster}/k")
    assert kv is not None and kv.value == b"v"


def test_no_endpoint_answers(cluster: str) -> None:
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    client = EtcdClient(",".join(dead), timeout_s=0.5)
    started = time.monotonic()
    with pytest.raises(EtcdError) as info:
        client.get(f"/{cluster}/k")
    assert time.monotonic() - started < 5
    assert info.value.code is None
    for url in dead:
        assert url in str(info.value)


def test_parse_endpoints() -> None:
    assert parse_endpoints(" http://a:2379/ ,https://b:1 ") == ("http://a:2379", "https://b:1")
    for bad in ("", " , ", "a:2379", "ftp://a:1"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)
