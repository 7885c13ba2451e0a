from __future__ import annotations

from pathlib import Path

import pytest

from dq.server.lifespan import open_engine
from dq.server.settings import MAX_DEFAULT_BODY, Settings, SettingsError


def test_defaults_match_the_product() -> None:
    s = Settings.from_env({})
    assert (s.data_dir, s.host, s.port, s.fsync) == ("./dq-data", "127.0.0.1", 8080, "always")
    assert s.max_batch == 1000 and s.max_value_bytes == 1 << 20 and s.tokens == ()
    # A body is refused before it is read above 64 MiB, whatever the batch and value limits.
    assert s.body_limit == MAX_DEFAULT_BODY == 64 << 20
    small = s.replace(max_value_bytes=1024)
    assert small.body_limit > small.max_batch * small.max_value_bytes * 4 / 3
    assert (s.max_connections, s.header_timeout_s, s.body_timeout_s) == (1024, 10.0, 60.0)
    assert s.fast_path and s.loopback and not s.tls_cert
    assert s.shm and s.shm_max_clients == 256  # the local fast path is on by default
    assert not Settings.from_env({"DQ_SHM": "0"}).shm


def test_environment_and_flags() -> None:
    env = {
        "DQ_PORT": "9000", "DQ_FSYNC": "interval", "DQ_TOKENS": "a, b,c", "DQ_SHM": "yes",
        "DQ_MAX_BODY_BYTES": "1234", "DQ_SHM_SPIN_US": "10", "DQ_PLUGIN_X": "y", "HOME": "/x",
    }  # fmt: skip
    s = Settings.from_env(env)
    assert (s.port, s.fsync, s.tokens, s.shm, s.body_limit) == (
        9000,
        "interval",
        ("a", "b", "c"),
        True,
        1234,
    )
    assert s.shm_spin_us == 10.0 and s.extra == {"plugin_x": "y"}
    t = s.replace(port=None, host="0.0.0.0", fsync="never")
    assert (t.port, t.host, t.fsync) == (9000, "0.0.0.0", "never")


@pytest.mark.parametrize(
    "env",
    [
        {"DQ_PORT": "eighty"},
        {"DQ_FSYNC": "sometimes"},
        {"DQ_MAX_BATCH": "0"},
        {"DQ_SHM": "maybe"},
        {"DQ_TOKENS": ","},  # an empty token is an error, never "auth off"
        {"DQ_TOKENS": "a,,b"},
        {"DQ_MAX_CONNECTIONS": "0"},
        {"DQ_HEADER_TIMEOUT_S": "0"},
        {"DQ_TLS_CERT": "cert.pem"},  # without a key
    ],
)
def test_bad_values_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env(env)


def test_loopback() -> None:
    for host in ("127.0.0.1", "localhost", "::1", "[::1]"):
        assert Settings(host=host).loopback
    for host in ("0.0.0.0", "::", "10.1.2.3"):
        assert not Settings(host=host).loopback


def test_memseg_bytes_reaches_the_engine(tmp_path: Path) -> None:
    settings = Settings.from_env({"DQ_MEMSEG_BYTES": "65536", "DQ_DATA_DIR": str(tmp_path)})
    with open_engine(settings) as engine:
        assert engine.config.memseg_bytes == 65536
    assert Settings().memseg_bytes == 16 << 20
    with pytest.raises(SettingsError):
        Settings.from_env({"DQ_MEMSEG_BYTES": "0"})


def test_replication_settings() -> None:
    assert not Settings.from_env({}).replicated
    s = Settings.from_env(
        {
            "DQ_ETCD": "http://127.0.0.1:2379, http://127.0.0.2:2379",
            "DQ_NODE": "n1",
            "DQ_ADVERTISE_URL": "http://10.0.0.1:8080/",
            "DQ_MIN_INSYNC": "3",
            "DQ_LEADER_TTL_S": "5",
        }
    )
    assert s.replicated and s.node_name == "n1" and s.public_url == "http://10.0.0.1:8080"
    assert (s.cluster, s.min_insync, s.leader_ttl_s) == ("dq", 3, 5)
    assert (s.replica_timeout_ms, s.commit_timeout_ms, s.replica_window_bytes) == (
        2000,
        10_000,
        256 << 20,
    )
    derived = Settings.from_env({"DQ_ETCD": "http://e:2379", "DQ_PORT": "9001"})
    assert derived.public_url == "http://127.0.0.1:9001" and derived.node_name


@pytest.mark.parametrize(
    "env",
    [
        {"DQ_FSYNC": "interval"},  # a member acknowledges only what it fsynced
        {"DQ_FSYNC": "never"},
        {"DQ_ETCD": "etcd:2379"},  # not a URL
        {"DQ_MIN_INSYNC": "0"},
        {"DQ_LEADER_TTL_S": "0"},
        {"DQ_NODE": "a/b"},
        {"DQ_REPLICA_WINDOW_BYTES": "1000"},
    ],
)
def test_bad_replication_settings_are_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        Settings.from_env({"DQ_ETCD": "http://127.0.0.1:2379", **env})
    if "DQ_ETCD" not in env:
        Settings.from_env(env)  # the same values are fine on a single node
