"""The deploy files agree with the server they deploy.

Every ``DQ_*`` name the compose file or the Dockerfile sets is one the server reads, and
``docs/deploy.md`` names the settings the compose files take from the shell (every setting
is documented in ``docs/settings.md``, checked by ``tests/test_settings_doc.py``).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import yaml

from dq.server.settings import Settings

REPO = Path(__file__).resolve().parents[2]
SETTINGS_VARS = {"DQ_" + f.name.upper() for f in dataclasses.fields(Settings) if f.name != "extra"}


def test_compose_sets_only_variables_the_server_reads() -> None:
    compose = yaml.safe_load((REPO / "docker" / "docker-compose.yml").read_text())
    env = compose["services"]["dq"]["environment"]
    names = set(env)
    assert names, "the dq service passes no DQ_* configuration"
    assert names <= SETTINGS_VARS, f"unknown to server/settings.py: {names - SETTINGS_VARS}"
    assert compose["services"]["dq"]["volumes"] == ["dq-data:/var/lib/dq"]
    assert "dq-data" in compose["volumes"]
    assert compose["services"]["spark-job"]["profiles"] == ["spark"]


def test_dockerfile_sets_only_variables_the_server_reads() -> None:
    text = (REPO / "docker" / "Dockerfile").read_text()
    names = set(re.findall(r"\b(DQ_[A-Z_]+)=", text))
    assert {"DQ_DATA_DIR", "DQ_PORT"} <= names
    # DQ_URL belongs to the Spark image's wait-for-dq entrypoint, not to the server.
    assert names - {"DQ_URL"} <= SETTINGS_VARS


def test_deploy_doc_names_what_the_compose_files_pass_through() -> None:
    """Every setting lives in docs/settings.md (tests/test_settings_doc.py); docs/deploy.md
    says which of them the compose files take from the shell, so an operator knows which
    need an edit of the file instead."""
    doc = (REPO / "docs" / "deploy.md").read_text()
    configure = doc.split("## Configure\n", 1)[1].split("\n## ", 1)[0]
    assert "docs/settings.md" in configure
    named = set(re.findall(r"`(DQ_[A-Z_]+)", configure))
    for name in ("docker-compose.yml", "compose.replicated.yml"):
        services = yaml.safe_load((REPO / "docker" / name).read_text())["services"]
        passed = {
            variable
            for service, spec in services.items()
            if service.startswith("dq")
            for variable, value in spec["environment"].items()
            if str(value).startswith("${" + variable)
        }
        assert passed, f"docker/{name} passes nothing through"
        assert passed <= named, f"docs/deploy.md does not say {name} passes {passed - named}"


def test_replicated_compose_is_three_etcd_and_three_dq_members() -> None:
    compose = yaml.safe_load((REPO / "docker" / "compose.replicated.yml").read_text())
    services = compose["services"]
    etcds = sorted(s for s in services if s.startswith("etcd"))
    dqs = sorted(s for s in services if s.startswith("dq"))
    assert (etcds, dqs) == (["etcd1", "etcd2", "etcd3"], ["dq1", "dq2", "dq3"])
    peers = ",".join(f"{e}=http://{e}:2380" for e in etcds)
    for name in etcds:
        env = services[name]["environment"]
        assert env["ETCD_NAME"] == name
        assert env["ETCD_INITIAL_CLUSTER"] == peers
        assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == f"http://{name}:2380"
        assert env["ETCD_ADVERTISE_CLIENT_URLS"] == f"http://{name}:2379"
        assert services[name]["volumes"] == [f"{name}-data:/var/lib/etcd"]
        assert services[name]["healthcheck"]["test"][:2] == ["CMD", "etcdctl"]
    clients = ",".join(f"http://{e}:2379" for e in etcds)
    ports = set()
    for name in dqs:
        service = services[name]
        env = service["environment"]
        assert set(env) <= SETTINGS_VARS, (
            f"unknown to server/settings.py: {set(env) - SETTINGS_VARS}"
        )
        assert env["DQ_FSYNC"] == "always", "replication needs every write fsynced"
        assert env["DQ_ETCD"] == clients
        assert env["DQ_NODE"] == name, "the smoke test stops the leader by its node name"
        assert env["DQ_ADVERTISE_URL"] == f"http://{name}:8080"
        assert service["volumes"] == [f"{name}-data:/var/lib/dq"]
        assert set(service["depends_on"]) == set(etcds)
        ports.add(service["ports"][0])
    assert len(ports) == 3
    assert set(compose["volumes"]) == {f"{s}-data" for s in etcds + dqs}
